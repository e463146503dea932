"""A lease's UID in the runtime: the ledger counts the known UIDs per device as it counts
trust domains, and a request id retried with another UID is another request."""

from __future__ import annotations

import pytest

from agent.core.errors import AlreadyExistsError
from agent.core.lease import Lease, LeaseState, transition
from agent.core.types import AdmissionRequest, PriorityClass
from agent.node.ledger import Ledger
from agent.node.requests import canonical, check_same, record_for


def lease(lease_id: str, uid: int | None, device: str = "GPU-0") -> Lease:
    return Lease(
        lease_id,
        f"r-{lease_id}",
        "t",
        "a",
        device,
        PriorityClass.BURSTABLE,
        1,
        1.0,
        LeaseState.ADMITTED,
        0.0,
        0.0,
        run_as_uid=uid,
    )


def test_the_ledger_counts_known_uids_per_device() -> None:
    ledger = Ledger(["GPU-0", "GPU-1"])
    first, second, unsaid, other = (
        lease("a", 1000),
        lease("b", 1000),
        lease("c", None),
        lease("d", 2000, "GPU-1"),
    )
    for x in (first, second, unsaid, other):
        ledger.take(x)
    assert ledger.users("GPU-0") == {1000} and ledger.users("GPU-1") == {2000}
    assert ledger.untake(first)
    assert ledger.users("GPU-0") == {1000}, "one lease of UID 1000 is left"
    ready = transition(second, LeaseState.READY, at=1.0)
    ledger.apply([ready])
    assert ledger.users("GPU-0") == {1000}, "a transition keeps the count"
    ledger.apply([transition(ready, LeaseState.RELEASED, at=2.0)])
    assert ledger.users("GPU-0") == frozenset(), "a lease without a UID does not count"
    assert ledger.users("GPU-9") == frozenset()
    ledger.restore(lease("e", 3000, "GPU-9"), None)  # a device the ledger did not list
    assert ledger.users("GPU-9") == {3000}


def request(uid: int | None) -> AdmissionRequest:
    return AdmissionRequest("r", "t", "a", PriorityClass.BURSTABLE, 1, 1.0, run_as_uid=uid)


def test_a_request_without_a_uid_keeps_its_fingerprint() -> None:
    """Request ids recorded before UIDs still match their retries."""
    assert "run_as_uid" not in canonical(request(None), None)
    assert canonical(request(0), None)["run_as_uid"] == 0


@pytest.mark.parametrize(("first", "again"), [(1000, 2000), (None, 1000), (1000, None)])
def test_a_request_id_retried_with_another_uid_is_another_request(
    first: int | None, again: int | None
) -> None:
    record = record_for(request(first), None, "l-1", 0.0)
    check_same(record, request(first), None)  # the same request: no complaint
    with pytest.raises(AlreadyExistsError, match="run_as_uid"):
        check_same(record, request(again), None)
