"""Cluster placement against a brute-force reference: every choice is the one the rule
names, capacity is conserved, and releases give back exactly what was taken."""

from __future__ import annotations

import random

import pytest

from agent.admission.cluster import FULL, Cluster, milli_of, order_and_place
from agent.admission.policy import Placement

SIZES = (0.1, 0.25, 0.3, 0.5, 0.75, 1.0, 2.0, 4.0, 8.0)


def feasible_gpus(cluster: Cluster, milli: int) -> list[int]:
    return [g for g, free in enumerate(cluster.free) if free >= milli]


def feasible_nodes(cluster: Cluster, count: int) -> list[int]:
    return [n for n, whole in enumerate(cluster.whole) if whole >= count]


def check_choice(before: Cluster, free: list[int], whole: list[int], gpus: float, slot) -> None:  # type: ignore[no-untyped-def]
    milli = milli_of(gpus)
    rule = before.placement
    if milli < FULL:
        options = [g for g, f in enumerate(free) if f >= milli]
        if not options:
            assert slot is None
            return
        assert slot is not None
        (gpu,) = slot.gpus
        if rule is Placement.BEST_FIT:
            assert free[gpu] == min(free[g] for g in options)
        elif rule is Placement.WORST_FIT:
            assert free[gpu] == max(free[g] for g in options)
        else:
            assert gpu == options[0]
        return
    count = milli // FULL
    options = [n for n, w in enumerate(whole) if w >= count]
    if not options:
        assert slot is None
        return
    assert slot is not None and len(slot.gpus) == count
    if rule is Placement.BEST_FIT:
        assert whole[slot.node] == min(whole[n] for n in options)
    elif rule is Placement.WORST_FIT:
        assert whole[slot.node] == max(whole[n] for n in options)
    else:
        assert slot.node == options[0]
    assert all(free[g] == FULL for g in slot.gpus)


@pytest.mark.parametrize("rule", list(Placement))
@pytest.mark.parametrize("seed", range(6))
def test_every_choice_is_the_rules_and_capacity_is_conserved(rule: Placement, seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster([rng.choice([1, 2, 4, 8]) for _ in range(12)], rule)
    held = []
    for _ in range(600):
        if held and rng.random() < 0.4:
            cluster.release(held.pop(rng.randrange(len(held))))
        else:
            gpus = rng.choice(SIZES)
            free, whole = list(cluster.free), list(cluster.whole)
            slot = cluster.place(gpus)
            check_choice(cluster, free, whole, gpus, slot)
            if slot is not None:
                held.append(slot)
        used = sum(s.milli * len(s.gpus) for s in held)
        assert cluster.used_milli == used == cluster.total_milli - sum(cluster.free)
        assert cluster.whole == [
            sum(cluster.free[g] == FULL for g in gpus) for gpus in cluster.gpus_of
        ]
    for slot in held:
        cluster.release(slot)
    assert cluster.free == [FULL] * len(cluster.free) and cluster.used_milli == 0


@pytest.mark.parametrize(
    ("gpus", "milli"), [(0.05, 50), (0.5, 500), (0.9999, 1000), (1, 1000), (2.5, 3000), (8, 8000)]
)
def test_requests_in_milli_gpu(gpus: float, milli: int) -> None:
    assert milli_of(gpus) == milli


def test_a_fraction_never_spills_and_whole_gpus_stay_on_one_node() -> None:
    cluster = Cluster([2, 2], Placement.BEST_FIT)
    assert cluster.place(3) is None, "no node has 3 GPUs"
    first = cluster.place(0.6)
    second = cluster.place(0.6)
    assert first is not None and second is not None and first.gpus != second.gpus
    block = cluster.place(2)
    assert block is None or block.node not in {first.node, second.node}


def test_order_and_place_puts_the_highest_scores_first_ties_in_arrival_order() -> None:
    cluster = Cluster([1], Placement.BEST_FIT)
    slots = order_and_place(cluster, [1.0, 1.0, 1.0], scores=[0.2, 0.9, 0.9])
    assert [s is not None for s in slots] == [False, True, False]
    plain = order_and_place(Cluster([1], Placement.BEST_FIT), [1.0, 1.0])
    assert [s is not None for s in plain] == [True, False]
