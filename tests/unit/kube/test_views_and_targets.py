"""The cluster side reads agents' answers and EndpointSlices; pure, tested by tables."""

from __future__ import annotations

import dataclasses

import pytest

from agent.admission.policy import Rules, decide
from agent.api.proto import agent_pb2 as pb
from agent.core.lease import LeaseState
from agent.core.types import AdmissionRequest, PriorityClass, ReasonCode
from agent.core.units import GIB
from agent.legacy.cluster.agents import targets_from_slices
from agent.legacy.cluster.views import device_views, lease_of

UUIDS = ("GPU-00000000-0000-0000-0000-000000000001", "GPU-00000000-0000-0000-0000-000000000002")


def node(leases: list[pb.Lease], closed: str = "") -> pb.GetNodeResponse:
    return pb.GetNodeResponse(
        devices=[
            pb.Device(uuid=u, index=i, model="H100", memory_bytes=80 * GIB, sharing_mode="mps")
            for i, u in enumerate(UUIDS)
        ],
        leases=leases,
        ledger=[pb.DeviceLedger(device_uuid=UUIDS[1], closed=closed, closed_detail="drained: x")]
        if closed
        else [],
    )


def lease(lease_id: str, device: int, memory_gib: int, domain: str = "a") -> pb.Lease:
    return pb.Lease(
        lease_id=lease_id, request_id=f"r-{lease_id}", tenant=domain, trust_domain=domain,
        device_uuid=UUIDS[device], priority="burstable", memory_bytes=memory_gib * GIB,
        thread_pct=25, state="admitted", created_at=1.0, updated_at=1.0, pod="ns/p",
    )  # fmt: skip


def ask(memory_gib: int, domain: str = "a") -> AdmissionRequest:
    return AdmissionRequest("r", domain, domain, PriorityClass.BURSTABLE, memory_gib * GIB, 25)


def test_a_node_answer_becomes_the_views_the_rules_decide_on() -> None:
    views = device_views(node([lease("l-1", 0, 70)], closed="DRAINING"))
    assert [len(v.leases) for v in views] == [1, 0]
    assert views[1].closed is ReasonCode.DRAINING and views[1].closed_detail == "drained: x"
    decision = decide(ask(20), views, Rules(), now=0.0)
    assert not decision.admitted and decision.reason is ReasonCode.NO_MEMORY


def test_binds_in_flight_count_until_the_answer_shows_them() -> None:
    answer = node([lease("l-1", 0, 40)])
    in_flight = lease_of(lease("l-2", 0, 30))
    views = device_views(answer, [in_flight, lease_of(lease("l-1", 0, 40))])  # l-1: once
    assert [x.lease_id for x in views[0].leases] == ["l-1", "l-2"]
    assert views[0].memory_committed_bytes == 70 * GIB
    assert in_flight.state is LeaseState.ADMITTED and in_flight.pod == "ns/p"


def test_the_agents_words_come_back_for_a_trust_conflict() -> None:
    views = device_views(node([lease("l-1", 0, 10, "a"), lease("l-2", 1, 10, "a")]))
    decision = decide(ask(10, "b"), views, Rules(), now=0.0)
    assert decision.reason is ReasonCode.TRUST_CONFLICT
    assert "trust domain 'a'" in decision.message


def test_the_agents_words_come_back_for_a_user_conflict() -> None:
    """A lease's UID travels in the node's answer: the extender's views refuse a share of
    another UID on its device as the agent would, and a lease without one counts for none."""
    one = lease("l-1", 0, 10)
    one.run_as_uid = 1000
    views = device_views(node([one, lease("l-2", 1, 10)]))
    assert lease_of(one).run_as_uid == 1000 and lease_of(lease("l-2", 1, 10)).run_as_uid is None
    assert [v.users for v in views] == [frozenset({1000}), frozenset()]
    other = dataclasses.replace(ask(10), run_as_uid=2000)
    decision = decide(other, views[:1], Rules(), now=0.0)
    assert decision.reason is ReasonCode.USER_CONFLICT and "UID 1000" in decision.message
    assert decide(other, views, Rules(), now=0.0).admitted  # the device without a UID


GRPC = [{"name": "grpc", "port": 9807}]


def slice_(endpoints: list[dict], ports: list[dict] = GRPC) -> dict:  # type: ignore[type-arg]
    return {"endpoints": endpoints, "ports": ports}


def at(address: str, node: str | None = "gpu-1", **conditions: bool) -> dict:  # type: ignore[type-arg]
    found: dict = {"addresses": [address], "conditions": conditions}  # type: ignore[type-arg]
    if node:
        found["nodeName"] = node
    return found


@pytest.mark.parametrize(
    ("slices", "targets"),
    [
        ([slice_([at("10.0.0.7")])], {"gpu-1": "10.0.0.7:9807"}),
        ([slice_([at("fd00::7")])], {"gpu-1": "[fd00::7]:9807"}),
        ([slice_([at("10.0.0.7", ready=False)])], {}),
        ([slice_([at("10.0.0.7", node=None)])], {}),
        ([slice_([at("10.0.0.7")], [{"name": "metrics", "port": 9808}])], {}),
        (
            [slice_([at("10.0.0.7")]), slice_([at("10.0.0.8", "gpu-2")])],
            {"gpu-1": "10.0.0.7:9807", "gpu-2": "10.0.0.8:9807"},
        ),
    ],
)
def test_agents_are_found_by_their_endpoint_slices(slices: list, targets: dict) -> None:  # type: ignore[type-arg]
    assert targets_from_slices(slices) == targets
