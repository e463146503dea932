"""Whom a shared claim's processes belong to (agent.claims.users.ClaimPods): the pods
the claim is reserved for, as last read, for the claim leases bound to no one pod; and
which pods' users were read, so that a pod that joins is read once."""

from __future__ import annotations

import dataclasses
from typing import Any

from agent.claims.users import ClaimPods
from agent.core.lease import CLAIM_OWNER, Lease, LeaseState
from agent.core.types import PriorityClass
from agent.core.units import GIB
from tests.helpers import FakeClock

POD_A = "7d4424e6-bb13-42f4-a47a-45a4828bf54d"
POD_B = "a5c1f8d5-1919-434d-add7-4afaafdaef89"


def claim(uid: str, *pods: str) -> dict[str, Any]:
    reserved = [{"resource": "pods", "name": f"p-{p[:4]}", "uid": p} for p in pods]
    return {"metadata": {"uid": uid}, "status": {"reservedFor": reserved}}


def lease(lease_id: str, claim_uid: str, workload: str = "") -> Lease:
    made = Lease(
        lease_id, f"dra:{claim_uid}:s", "t", "t", "GPU-0", PriorityClass.BURSTABLE,
        4 * GIB, 25.0, LeaseState.READY, 0.0, 0.0, workload=workload,
    )  # fmt: skip
    return dataclasses.replace(made, owner=CLAIM_OWNER)


def test_a_shared_claims_lease_is_bound_to_its_pods_as_last_read() -> None:
    pods = ClaimPods()
    pods.saw(claim("c1", POD_B, POD_A))
    pods.saw(claim("c2", POD_A))
    leases = [lease("l-1", "c1"), lease("l-2", "c2", workload=f"pod:{POD_A}"), lease("l-3", "c3")]
    # l-2 is its one pod's already; c3 was never read
    assert pods.bound_now(leases) == {"l-1": f"pods:{POD_A},{POD_B}"}
    pods.saw(claim("c1", POD_B))  # a pod left the claim
    assert pods.bound_now(leases) == {"l-1": f"pods:{POD_B}"}
    pods.saw(claim("c1"))  # reserved for no one
    assert pods.bound_now(leases) == {}


def test_a_pod_is_new_until_its_users_were_read() -> None:
    pods = ClaimPods()
    assert pods.saw(claim("c1", POD_A)) == [(f"p-{POD_A[:4]}", POD_A)]
    pods.checked(claim("c1", POD_A))  # the binding answer read it
    assert pods.saw(claim("c1", POD_A, POD_B)) == [(f"p-{POD_B[:4]}", POD_B)]
    assert pods.saw(claim("c1", POD_A, POD_B)) == [(f"p-{POD_B[:4]}", POD_B)], "not read yet"
    pods.checked(claim("c1", POD_A, POD_B), [POD_B])
    assert pods.saw(claim("c1", POD_A, POD_B)) == []


def test_claims_without_a_live_lease_are_forgotten_once_not_read_for_a_while() -> None:
    clock = FakeClock()
    pods = ClaimPods(keep_s=300, clock=clock)
    pods.saw(claim("c1", POD_A))  # read by a binding answer about to admit
    assert pods.bound_now([]) == {}
    clock.advance(10)
    assert pods.bound_now([lease("l-1", "c1")]) == {"l-1": f"pods:{POD_A}"}, "kept meanwhile"
    clock.advance(301)
    assert pods.bound_now([]) == {}
    assert pods.bound_now([lease("l-1", "c1")]) == {}, "forgotten"
    assert pods.saw(claim("c1", POD_A)) == [(f"p-{POD_A[:4]}", POD_A)], "to be read again"
