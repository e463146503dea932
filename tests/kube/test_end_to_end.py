"""A pod's whole way on a cluster on loopback (tests/kubeworld/cluster/): the webhook, the
second scheduler with the extender, the bind through the node's agent, the kubelet's
Allocate answered by the agent's device plugin, and the controller giving the lease back
when the pod ends. Real agents (``gpushare serve --sim``) stand for the GPU nodes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.api.proto import agent_pb2 as pb
from tests.kubeworld.cluster.device_plugin import (
    LoopbackCluster,
    Refused,
    agent_call,
    eventually,
    gpu_pod,
    loopback_cluster,
)
from tests.kubeworld.scheduler.extender import SchedulerStandIn

pytestmark = pytest.mark.timeout(180)

LEASE = "gpushare.io/lease"


@pytest.fixture
async def cluster(root: Path) -> AsyncIterator[tuple[LoopbackCluster, SchedulerStandIn]]:
    async with loopback_cluster(root, nodes=2) as (cluster, scheduler):
        assert scheduler is not None
        yield cluster, scheduler


def running(cluster: LoopbackCluster, namespace: str, name: str) -> bool:
    pod = cluster.api_server.pod(namespace, name)
    return pod is not None and pod["status"].get("phase") == "Running"


async def live_leases(cluster: LoopbackCluster) -> list[tuple[str, str, str]]:
    """(node, pod, lease id) of every live pod lease on every agent."""
    found = []
    for node, leases in (await cluster.all_leases()).items():
        found += [(node, x.pod, x.lease_id) for x in leases if x.pod]
    return found


async def test_a_pod_runs_under_its_own_lease_and_gives_it_back_when_deleted(
    cluster: tuple[LoopbackCluster, SchedulerStandIn],
) -> None:
    c, _ = cluster
    created = await c.apply(gpu_pod("train-0", memory="6Gi", threads="30"))
    assert created["spec"]["schedulerName"] == "gpushare"  # the webhook's mutation
    assert LEASE in created["metadata"]["finalizers"]
    await eventually(lambda: running(c, "team-a", "train-0"))

    pod = c.api_server.pod("team-a", "train-0")
    assert pod is not None
    lease_id = pod["metadata"]["annotations"][LEASE]
    node = pod["spec"]["nodeName"]
    env = c.kubelets.env("team-a", "train-0") if c.kubelets else {}
    assert env["GPUSHARE_LEASE_ID"] == lease_id
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"]
    leases = {x.lease_id: x for x in await c.leases(node)}
    assert leases[lease_id].pod == "team-a/train-0"
    assert leases[lease_id].request_id == pod["metadata"]["uid"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == leases[lease_id].device_uuid

    c.api_server.delete_pod("team-a", "train-0")
    await eventually(lambda: c.api_server.pod("team-a", "train-0") is None)
    assert await live_leases(c) == []


async def test_a_bad_annotation_is_refused_at_apply_with_the_field_and_the_reason(
    cluster: tuple[LoopbackCluster, SchedulerStandIn],
) -> None:
    c, _ = cluster
    with pytest.raises(Refused, match=r"gpushare\.io/threads"):
        await c.apply(gpu_pod("bad", threads="250"))
    with pytest.raises(Refused, match=r"gpushare\.io/gang"):
        pod = gpu_pod("lonely")
        pod["metadata"]["annotations"]["gpushare.io/gang-size"] = "4"
        await c.apply(pod)
    assert c.api_server.pod("team-a", "bad") is None


async def test_a_pod_that_fits_nowhere_stays_pending_with_the_agents_reasons(
    cluster: tuple[LoopbackCluster, SchedulerStandIn],
) -> None:
    c, _ = cluster
    await c.apply(gpu_pod("huge", memory="900Gi"))
    await eventually(lambda: bool(c.api_server.events_for("huge", "team-a")))
    event = c.api_server.events_for("huge", "team-a")[0]
    assert event["reason"] == "FailedScheduling"
    node = next(iter(c.nodes.values()))
    explained = await agent_call(
        node,
        c.agent_token,
        "explain",
        tenant="team-a",
        trust_domain="team-a",
        priority=pb.BURSTABLE,
        memory_bytes=900 * 2**30,
        thread_pct=25,
    )
    assert not explained.decision.admitted
    sentence = f"{explained.decision.reason}: {explained.decision.message}"
    assert event["message"] == f"0/2 nodes are available: 2 {sentence}."
    pod = c.api_server.pod("team-a", "huge")
    assert pod is not None and not pod["spec"].get("nodeName")
    assert await live_leases(c) == []


async def test_pods_bound_to_one_node_at_once_each_get_their_own_lease(
    cluster: tuple[LoopbackCluster, SchedulerStandIn],
) -> None:
    c, _ = cluster
    sizes = {f"job-{i}": (1 + i) for i in range(8)}  # GiB, all different
    await asyncio.gather(
        *(c.apply(gpu_pod(name, memory=f"{gib}Gi")) for name, gib in sizes.items())
    )
    await eventually(lambda: all(running(c, "team-a", name) for name in sizes), 60)
    assert c.kubelets is not None
    per_node: dict[str, int] = {}
    for name, gib in sizes.items():
        pod = c.api_server.pod("team-a", name)
        assert pod is not None
        env = c.kubelets.env("team-a", name)
        assert env["GPUSHARE_LEASE_ID"] == pod["metadata"]["annotations"][LEASE], name
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={gib * 1024}M", name
        per_node[pod["spec"]["nodeName"]] = per_node.get(pod["spec"]["nodeName"], 0) + 1
    assert max(per_node.values()) >= 2  # some node took several pods
    leases = await live_leases(c)
    assert sorted(pod for _, pod, _ in leases) == sorted(f"team-a/{n}" for n in sizes)
    for node in c.nodes.values():
        assert "allocation_mismatch" not in node.log_text()


async def test_a_gang_is_bound_all_or_nothing(
    cluster: tuple[LoopbackCluster, SchedulerStandIn],
) -> None:
    c, _ = cluster
    for i in range(2):  # two members of three: reserved, then aborted at the TTL
        await c.apply(gpu_pod(f"worker-{i}", gang="job-42", gang_size=3))

    def aborted() -> bool:  # the gang TTL (5 s in these tests) ran out
        return any(
            "gang team-a/job-42" in e["message"] for e in c.api_server.events_for("worker-0")
        )

    await eventually(aborted, 30)
    for i in range(2):
        pod = c.api_server.pod("team-a", f"worker-{i}")
        assert pod is not None and not pod["spec"].get("nodeName")
    assert not [x for x in await live_leases(c) if x[1].startswith("team-a/worker")]
    await c.apply(gpu_pod("worker-2", gang="job-42", gang_size=3))
    names = [f"worker-{i}" for i in range(3)]
    await eventually(lambda: all(running(c, "team-a", n) for n in names), 60)
    leases = await live_leases(c)
    assert sorted(pod for _, pod, _ in leases) == sorted(f"team-a/{n}" for n in names)


async def test_a_force_deleted_pod_gives_its_lease_back_and_loses_the_finalizer(
    cluster: tuple[LoopbackCluster, SchedulerStandIn],
) -> None:
    c, _ = cluster
    await c.apply(gpu_pod("doomed"))
    await eventually(lambda: running(c, "team-a", "doomed"))
    assert len(await live_leases(c)) == 1
    c.api_server.delete_pod("team-a", "doomed", force=True)
    await eventually(lambda: c.api_server.pod("team-a", "doomed") is None)
    assert await live_leases(c) == []
