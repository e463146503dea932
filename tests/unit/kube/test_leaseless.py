"""Pods bound with a lease that is no longer live on their node (evicted while ``kube
serve`` was down): found by the reconcile from two answers of the node's agent, and
deleted as an evicted pod is."""

from __future__ import annotations

import asyncio

import pytest

from agent.api.proto import agent_pb2 as pb
from agent.core.lease import Lease, LeaseState
from agent.core.types import PriorityClass
from agent.kubeapi.port import Obj
from agent.legacy.cluster.cache import NodeEntry
from agent.legacy.cluster.controller import LeaseController
from agent.legacy.cluster.leaseless import LeaselessPods
from tests.unit.kube.test_controller import NODE, NOW, Api, Cache, lease, pod


def entry(*leases: pb.Lease) -> NodeEntry:
    found = NodeEntry(NODE, "127.0.0.1:9807", link=object(), error="")  # type: ignore[arg-type]
    found.snapshot = pb.GetNodeResponse(leases=list(leases))
    return found


def answer_again(node: NodeEntry, *leases: pb.Lease) -> None:
    node.snapshot = pb.GetNodeResponse(leases=list(leases))  # a newer answer


def pending(lease_id: str) -> Lease:
    return Lease(
        lease_id=lease_id, request_id="uid-p", tenant="team", trust_domain="team",
        device_uuid="GPU-1", priority=PriorityClass.BURSTABLE, memory_bytes=1, thread_pct=1,
        state=LeaseState.ADMITTED, created_at=0.0, updated_at=0.0,
    )  # fmt: skip


def running(the_pod: Obj) -> Obj:
    the_pod["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    return the_pod


def due(tracker: LeaselessPods, pods: list[Obj], node: NodeEntry, now: float) -> list[str]:
    return [x.pod["metadata"]["name"] for x in tracker.due(pods, {NODE: node}, now)]


def waiting(the_pod: Obj) -> Obj:
    """As the kubelet reports a container it cannot create (CreateContainerError)."""
    state = {"waiting": {"reason": "CreateContainerError"}}
    the_pod["status"]["containerStatuses"] = [{"name": "main", "state": state}]
    return the_pod


def test_a_pod_whose_lease_is_gone_from_two_answers_grace_apart_is_due() -> None:
    tracker, node = LeaselessPods(grace_s=10), entry()
    pods = [waiting(pod("p", node=NODE, lease="L-p", phase="Running"))]
    assert due(tracker, pods, node, 0.0) == []  # first seen without it
    assert due(tracker, pods, node, 20.0) == []  # the same answer: maybe not refreshed
    answer_again(node)
    assert due(tracker, pods, node, 5.0) == []  # a newer answer, but within the grace
    assert due(tracker, pods, node, 21.0) == ["p"]
    answer_again(node)
    assert due(tracker, pods, node, 30.0) == []  # handed out: its deletion is under way
    assert due(tracker, pods, node, 41.0) == ["p"]  # still there twice the grace later


@pytest.mark.parametrize(
    ("the_pod", "leases", "why"),
    [
        (pod("p", node=NODE, lease="L-p"), [lease("p")], "its lease is live"),
        (pod("p", node=NODE, lease="L-p", phase="Succeeded"), [], "ended"),
        (pod("p"), [], "not bound"),
        (pod("p", node=NODE), [], "bound without a lease annotation"),
        (pod("p", node="node-b", lease="L-p"), [], "its node has no agent here"),
        (running(pod("p", node=NODE, lease="L-p", phase="Running")), [], "a container runs"),
        (
            pod("p", node=NODE, lease="L-p"),
            [pb.Lease(lease_id="", pod="team/q", state="admitted")],
            "the answer hides another owner's lease: a missing one cannot be told",
        ),
    ],
)
def test_pods_that_are_never_due(the_pod: Obj, leases: list[pb.Lease], why: str) -> None:
    tracker, node = LeaselessPods(grace_s=0), entry(*leases)
    for now in (0.0, 1.0):
        answer_again(node, *leases)
        assert due(tracker, [the_pod], node, now) == [], why


def test_a_bind_under_way_and_an_agent_not_answering_are_left_alone() -> None:
    tracker, node = LeaselessPods(grace_s=0), entry()
    pods = [pod("p", node=NODE, lease="L-p")]
    node.pending["L-p"] = pending("L-p")  # granted; no answer shows it yet
    for now in (0.0, 1.0):
        answer_again(node)
        assert due(tracker, pods, node, now) == []
    del node.pending["L-p"]
    node.stale = True  # its last GetNode failed
    for now in (2.0, 3.0):
        answer_again(node)
        assert due(tracker, pods, node, now) == []
    node.stale = False
    assert due(tracker, pods, node, 4.0) == []  # counted from here
    answer_again(node)
    assert due(tracker, pods, node, 5.0) == ["p"]


async def test_the_reconcile_deletes_such_a_pod_with_an_event() -> None:
    api, cache = Api(), Cache()
    now = [NOW]
    leases = LeaseController(api, cache, grace_s=60, clock=lambda: now[0])  # type: ignore[arg-type]
    leases.acting = True  # as while act() runs
    cache.nodes[NODE].link = object()  # type: ignore[assignment]
    await leases.handle(waiting(pod("p", node=NODE, lease="L-p", phase="Running")))
    await leases.reconcile()  # its lease is not in the agent's answer
    cache.nodes[NODE].snapshot = pb.GetNodeResponse()  # a newer answer, still without it
    now[0] += 30
    await leases.reconcile()
    assert api.deleted == []  # within the grace
    now[0] += 60
    await leases.reconcile()
    await asyncio.gather(*leases._tasks)
    assert api.deleted == [("p", "uid-p")]
    assert api.events[0]["reason"] == "LeaseEvicted"
    assert "L-p is no longer live there" in api.events[0]["message"]
