"""The node state published end to end: a real ``gpushare serve --sim`` agent followed by
the agents' cache, the real REST adapter, and the stand-in API server. The node gets the
``gpushare.io/ready`` label and the ``GpushareReady`` condition beside the kubelet's own;
a lease shows in the free memory at the next heartbeat; a stopped agent turns the node
not ready (``AgentUnreachable``)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.admission.policy import Rules
from agent.client import AgentClient, Priority
from agent.core.units import GIB
from agent.kubeapi.rest import RestKubeApi
from agent.legacy.cluster.cache import AgentCache
from agent.legacy.cluster.nodestate import CONDITION, READY_LABEL, publish_node_states
from tests.helpers import spawn_agent
from tests.kubeworld.apiserver import FakeApiServer

pytestmark = pytest.mark.timeout(180)

TOKEN = "node-state-test-token"
NODE = "gpu-node-1"
INTERVAL_S = 0.3
START_S = 90.0  # a simulated agent starts in seconds, on a busy machine in tens of them
FREE = re.compile(r"^GPU-[0-9a-f]{8}: \d+\.\d GiB, 200% threads free$")
CLOSED = re.compile(r"^GPU-[0-9a-f]{8}: closed \(.+\)$")  # a busy machine may fail a daemon


@pytest.fixture
def agent(root: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = spawn_agent(root, "--set", "mps.command_timeout_s=30")  # patient on busy machines
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def condition_of(node: dict[str, Any] | None) -> dict[str, Any]:
    assert node is not None
    found = [c for c in node["status"]["conditions"] if c["type"] == CONDITION]
    return found[0] if found else {}


def showing(server: FakeApiServer, status: str, label: str, reason: str = "") -> bool:
    """The condition and the label (two writes) both show this state."""
    node = server.node(NODE)
    condition = condition_of(node)
    return (
        node is not None
        and node["metadata"]["labels"].get(READY_LABEL) == label
        and condition.get("status") == status
        and (not reason or condition.get("reason") == reason)
    )


async def until(what: Callable[[], bool], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not what():
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def cluster_side(server: FakeApiServer, target: str) -> AsyncIterator[AgentCache]:
    """The cache following one agent and the publisher, as ``gpushare kube serve`` runs
    them (a plaintext connection, as with ``insecure_agents``)."""
    kube = RestKubeApi.from_url(server.url, token=TOKEN, timeout_s=5.0)
    cache = AgentCache(lambda t: AgentClient(t, attempts=2))
    cache.set_targets({NODE: target})
    task = asyncio.create_task(
        publish_node_states(kube, cache, Rules(), interval_s=INTERVAL_S), name="node-states"
    )
    try:
        yield cache
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await cache.aclose()
        await kube.aclose()


async def test_the_node_shows_the_agents_state_and_its_absence(
    root: Path, agent: subprocess.Popen[bytes]
) -> None:
    target = f"unix:{root}/agent.sock"
    await until((root / "agent.sock").exists, START_S)  # spares the backoff
    async with FakeApiServer(token=TOKEN) as server:
        server.create_node(NODE, labels={"zone": "a"})
        async with cluster_side(server, target) as cache:
            await cache.wait_ready(START_S)
            assert cache.nodes[NODE].snapshot is not None, (root / "agent.log").read_text()
            await until(lambda: showing(server, "True", "true"))
            node = server.node(NODE)
            assert node is not None
            assert node["metadata"]["labels"] == {
                "kubernetes.io/hostname": NODE,
                "zone": "a",
                READY_LABEL: "true",
            }
            types = [c["type"] for c in node["status"]["conditions"]]
            assert types == ["Ready", "MemoryPressure", CONDITION]  # merged by type
            ready = condition_of(node)
            assert ready["reason"] == "AgentReady"
            parts = ready["message"].split("; ")
            assert len(parts) == 4, ready["message"]
            assert all(FREE.match(p) or CLOSED.match(p) for p in parts), ready["message"]

            async with AgentClient(target, attempts=2) as client:
                admitted = await client.admit(
                    tenant="t", trust_domain="t", priority=Priority.BURSTABLE,
                    memory_bytes=20 * GIB, thread_pct=25,
                )  # fmt: skip
            assert admitted.decision.admitted
            device = admitted.lease.device_uuid[:12]
            await until(lambda: "175% threads" in condition_of(server.node(NODE))["message"])
            shown = condition_of(server.node(NODE))
            assert re.search(rf"{device}: \d+\.\d GiB, 175% threads free", shown["message"])
            assert shown["lastTransitionTime"] == ready["lastTransitionTime"]

            agent.terminate()
            assert await asyncio.to_thread(agent.wait, 30) == 0
            # (a stopping agent may first close its devices: not ready, then unreachable)
            await until(lambda: showing(server, "False", "false", "AgentUnreachable"))
            node = server.node(NODE)
            assert node is not None
            assert node["metadata"]["labels"][READY_LABEL] == "false"
            down = condition_of(node)
            assert down["status"] == "False"
            assert down["message"].startswith(f"the gpushare agent on {NODE} does not answer: ")
            assert ready["lastTransitionTime"] <= down["lastTransitionTime"]
            assert down["lastTransitionTime"] <= down["lastHeartbeatTime"]
            assert [c["type"] for c in node["status"]["conditions"]].count(CONDITION) == 1
