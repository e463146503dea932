"""The w-window degradation rule, window by window."""

from __future__ import annotations

import dataclasses

from agent.admission.degradation import DegradationRule, DeviceHealth, eviction_candidate, step
from agent.core.lease import CLAIM_OWNER, Lease, LeaseState
from agent.core.types import PriorityClass

RULE = DegradationRule(w=3, margin=0.05, cooldown_windows=2)


def lease(
    lease_id: str, priority: PriorityClass, created_at: float, floor: float | None = None
) -> Lease:
    return Lease(
        lease_id,
        f"r-{lease_id}",
        "t",
        "a",
        "GPU-0",
        priority,
        1,
        10.0,
        LeaseState.ADMITTED,
        created_at,
        created_at,
        retention_floor=floor,
    )


LEASES = [
    lease("protected", PriorityClass.GUARANTEED, 0.0, floor=0.8),
    lease("old-be", PriorityClass.BEST_EFFORT, 10.0),
    lease("young-be", PriorityClass.BEST_EFFORT, 20.0),
    lease("burst", PriorityClass.BURSTABLE, 30.0),
]


def run(
    windows: list[float | None], leases: list[Lease] = LEASES, rule: DegradationRule = RULE
) -> list:  # type: ignore[type-arg]
    health, steps = DeviceHealth(), []
    for value in windows:
        estimates = None if value is None else {x.lease_id: value for x in leases}
        result = step(rule, health, leases, estimates)
        health = result.health
        steps.append(result)
    return steps


def test_w_windows_under_the_floor_degrade_and_evict_the_youngest_best_effort_once() -> None:
    steps = run([0.7, 0.7, 0.7, 0.7, 0.7])
    assert [s.health.degraded for s in steps] == [False, False, True, True, True]
    assert [s.evict for s in steps] == [None, None, "young-be", None, None]
    assert steps[2].became_degraded and "protected" in steps[2].reason


def test_still_degraded_after_the_cooldown_evicts_again() -> None:
    steps = run([0.7] * 6)
    assert [s.evict for s in steps] == [None, None, "young-be", None, None, "young-be"]


def test_a_dip_shorter_than_w_does_nothing() -> None:
    steps = run([0.7, 0.7, 0.9, 0.7, 0.7, 0.9])
    assert not any(s.health.degraded or s.evict for s in steps)


def test_stale_telemetry_pauses_the_rule() -> None:
    steps = run([0.7, 0.7, None, None, None])
    assert not any(s.health.degraded or s.evict for s in steps)
    assert steps[2].reason.startswith("telemetry stale")
    resumed = run([0.7, 0.7, None, 0.7])
    assert resumed[-1].health.degraded, "the pause neither resets nor advances the count"


def test_recovery_needs_w_windows_at_floor_plus_margin() -> None:
    steps = run([0.7, 0.7, 0.7, 0.82, 0.9, 0.9, 0.9])
    assert [s.health.degraded for s in steps] == [False, False, True, True, True, True, False]
    assert steps[-1].recovered


def test_guaranteed_and_burstable_are_never_evicted() -> None:
    no_best_effort = [LEASES[0], LEASES[3]]
    steps = run([0.5] * 4, no_best_effort)
    assert steps[2].health.degraded and not any(s.evict for s in steps)
    assert "nothing to evict" in steps[2].reason


def test_eviction_can_be_switched_off() -> None:
    steps = run([0.5] * 4, rule=DegradationRule(w=3, evict=False))
    assert steps[2].health.degraded and not any(s.evict for s in steps)


def test_unprotected_devices_never_degrade() -> None:
    unprotected = LEASES[1:]
    assert not any(s.health.degraded for s in run([0.1] * 5, unprotected))


def test_a_dra_claims_share_is_never_the_one_evicted() -> None:
    young_claim = dataclasses.replace(
        lease("claim", PriorityClass.BEST_EFFORT, 40.0), owner=CLAIM_OWNER
    )
    assert eviction_candidate([*LEASES, young_claim]).lease_id == "young-be"  # type: ignore[union-attr]
    assert eviction_candidate([young_claim]) is None
