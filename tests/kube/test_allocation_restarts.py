"""The kubelet's allocations across an agent killed with SIGKILL and started again, on the
loopback cluster (tests/kubeworld/cluster/): a running pod's lease is never handed to the
next pod after the restart, and a pod whose Binding lands while its agent is away is
rejected by the kubelet as a real kubelet rejects it (Failed, UnexpectedAdmissionError,
no retry), its lease released, instead of staying Pending under a live lease."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.kube.test_end_to_end import live_leases, running
from tests.kube.test_end_to_end_faults import BINDING, lease_of_pod
from tests.kubeworld.cluster.device_plugin import (
    LoopbackCluster,
    eventually,
    gpu_pod,
    loopback_cluster,
)
from tests.kubeworld.kubelet.device_plugin import AdmissionRejected, Outcome

pytestmark = pytest.mark.timeout(240)


def phase(c: LoopbackCluster, name: str) -> str:
    pod = c.api_server.pod("team-a", name)
    return str((pod or {}).get("status", {}).get("phase", ""))


async def kubelet_outcome(c: LoopbackCluster, name: str, timeout_s: float = 60) -> Outcome:
    """What the node's kubelet came to for the pod's container (once it tried)."""
    assert c.kubelets is not None
    got = c.kubelets.got
    await eventually(lambda: ("team-a", name, "main") in got, timeout_s)
    return got[("team-a", name, "main")]


async def released(c: LoopbackCluster, lease_id: str, timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while lease_id in [lease for _, _, lease in await live_leases(c)]:
            await asyncio.sleep(0.1)


async def restart(c: LoopbackCluster, node_name: str) -> None:
    """SIGKILL the node's agent, start it again, wait for its device plugin."""
    node = c.nodes[node_name]
    node.kill()
    node.start()
    await c.wait_agents()


async def test_after_a_restart_the_next_pod_gets_its_own_lease_not_a_running_pods(
    root: Path,
) -> None:
    async with loopback_cluster(root, nodes=1) as (c, _):
        await c.apply(gpu_pod("first", memory="4Gi"))
        await eventually(lambda: running(c, "team-a", "first"), 60)
        node_name, first = await lease_of_pod(c, "first")  # admitted, its hold not over

        await restart(c, node_name)
        await c.apply(gpu_pod("second", memory="6Gi"))
        outcome = await kubelet_outcome(c, "second")

        assert outcome.error is None, (outcome.failed_at, outcome.error)
        assert outcome.response is not None
        _, second = await lease_of_pod(c, "second")
        assert outcome.response.envs["GPUSHARE_LEASE_ID"] == second != first
        assert outcome.response.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"
        await eventually(lambda: running(c, "team-a", "second"), 30)
        assert running(c, "team-a", "first")


async def test_a_pod_bound_while_its_agent_is_away_is_rejected_and_its_lease_released(
    root: Path,
) -> None:
    async with loopback_cluster(root, nodes=1) as (c, _):
        held = c.api_server.hold_next("POST", BINDING.format(name="orphan"))
        await c.apply(gpu_pod("orphan", memory="5Gi"))
        await eventually(held.arrived.is_set)  # granted; the pod not bound yet
        node_name, granted = await lease_of_pod(c, "orphan")
        node = c.nodes[node_name]
        node.kill()
        await node.kubelet.wait_for(lambda: not node.kubelet.healthy())  # stream gone
        held.release.set()  # the Binding lands while the agent is away

        outcome = await kubelet_outcome(c, "orphan")
        assert outcome.failed_at == "Allocate"
        assert isinstance(outcome.error, AdmissionRejected)
        assert "no healthy devices present" in str(outcome.error)
        await eventually(lambda: phase(c, "orphan") == "Failed", 30)

        node.start()
        await c.wait_agents()
        await released(c, granted)  # the pod ended: by the controller, once the agent answers

        await c.apply(gpu_pod("next", memory="5Gi"))
        outcome = await kubelet_outcome(c, "next", 90)
        assert outcome.error is None, (outcome.failed_at, outcome.error)
        assert outcome.response is not None
        _, lease_id = await lease_of_pod(c, "next")
        assert outcome.response.envs["GPUSHARE_LEASE_ID"] == lease_id != granted
        await eventually(lambda: running(c, "team-a", "next"), 30)
