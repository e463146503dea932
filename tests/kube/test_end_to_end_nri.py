"""The same flow on nodes whose container runtime has NRI: each agent registers as an NRI
plugin with the runtime stand-in, says so in GetNode (``injector: nri``), and the binds to
a node go at once instead of one after another's Allocate. Every container still gets its
own pod's lease, now at CreateContainer; a deleted pod gives its lease back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.api.proto import agent_pb2 as pb
from tests.kube.test_end_to_end import live_leases, running
from tests.kubeworld.cluster.device_plugin import agent_call, eventually, gpu_pod, loopback_cluster

pytestmark = pytest.mark.timeout(180)


async def test_pods_bound_to_one_nri_node_at_once_each_get_their_own_lease(root: Path) -> None:
    async with loopback_cluster(root, nodes=1, nri=True) as (c, _scheduler):
        [node] = c.nodes.values()
        answer = await agent_call(node, c.agent_token, "get_node")
        assert isinstance(answer, pb.GetNodeResponse) and answer.injector == "nri"
        sizes = {f"job-{i}": 1 + i for i in range(6)}  # GiB, all different
        await asyncio.gather(
            *(c.apply(gpu_pod(name, memory=f"{gib}Gi")) for name, gib in sizes.items())
        )
        await eventually(lambda: all(running(c, "team-a", name) for name in sizes), 60)
        assert c.kubelets is not None
        for name, gib in sizes.items():
            pod = c.api_server.pod("team-a", name)
            assert pod is not None
            env = c.kubelets.env("team-a", name)
            assert env["GPUSHARE_LEASE_ID"] == pod["metadata"]["annotations"]["gpushare.io/lease"]
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={gib * 1024}M", name
        assert node.log_text().count("by the runtime (NRI)") == len(sizes)
        for name in sizes:
            c.api_server.delete_pod("team-a", name, force=True)
        await eventually(lambda: all(c.api_server.pod("team-a", n) is None for n in sizes), 60)
        await eventually_async(lambda: live_leases(c), [])


async def eventually_async(read: object, wanted: object, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while await read() != wanted:  # type: ignore[operator]
            await asyncio.sleep(0.1)
