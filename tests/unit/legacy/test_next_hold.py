"""Which lease the kubelet's next Allocate gets: the oldest admitted pod lease not yet
allocated whose hold has not expired, a hold running from the lease's latest grant."""

from __future__ import annotations

import dataclasses

import pytest

from agent.core.lease import Lease, LeaseState
from agent.core.types import PriorityClass
from agent.legacy.deviceplugin.podalloc import next_hold


def lease(lease_id: str, created_at: float, **changes: object) -> Lease:
    base = Lease(
        lease_id, f"r-{lease_id}", "t", "t", "GPU-1", PriorityClass.BURSTABLE, 2**30, 25,
        LeaseState.ADMITTED, created_at, created_at, pod=f"ns/{lease_id}",
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("leases", "allocated", "now", "expected"),
    [
        ([lease("a", 1), lease("b", 2)], [], 5, "a"),
        ([lease("b", 2), lease("a", 1)], [], 5, "a"),  # by age, not by listing order
        ([lease("a", 1), lease("b", 2)], ["a"], 5, "b"),
        ([lease("a", 1), lease("b", 2)], ["a", "b"], 5, None),
        ([lease("a", 1), lease("b", 20)], [], 40, "b"),  # a's hold (30 s) expired
        ([lease("a", 1, pod=""), lease("b", 2)], [], 5, "b"),  # not a pod's lease
        # a gang's member, not committed yet
        ([lease("a", 1, state=LeaseState.RESERVED), lease("b", 2)], [], 5, "b"),
        ([lease("a", 1, state=LeaseState.READY), lease("b", 2)], [], 5, "b"),
        ([lease("a", 1, updated_at=30.0)], [], 40, "a"),  # committed at 30: held from then
        ([], [], 5, None),
    ],
)  # fmt: skip
def test_the_next_hold(
    leases: list[Lease], allocated: list[str], now: float, expected: str | None
) -> None:
    found = next_hold(leases, allocated, now=now, hold_s=30.0)
    assert (found.lease_id if found else None) == expected


@pytest.mark.parametrize(
    ("leases", "granted_at", "now", "expected"),
    [
        ([lease("a", 1)], {"a": 35.0}, 40, "a"),  # granted again at 35: held from then
        ([lease("a", 1)], {"a": 5.0}, 40, None),  # granted again, but long ago
        ([lease("a", 1, updated_at=30.0)], {"a": 5.0}, 40, "a"),  # the later of the two
        ([lease("a", 1), lease("b", 20)], {"a": 35.0}, 40, "a"),  # still by age
        ([lease("a", 1), lease("b", 20)], {"c": 35.0}, 40, "b"),  # another lease's grant
    ],
)  # fmt: skip
def test_a_grant_repeated_starts_the_hold_again(
    leases: list[Lease], granted_at: dict[str, float], now: float, expected: str | None
) -> None:
    found = next_hold(leases, [], now=now, hold_s=30.0, granted_at=granted_at)
    assert (found.lease_id if found else None) == expected
