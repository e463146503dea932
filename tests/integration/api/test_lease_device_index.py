"""Every RPC that answers with a lease carries the index of the lease's own device, the same
as GetNode shows (issue 17, item 5: Commit, Abort and Release answered device 0)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient, Priority
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import App, Ports
from tests.helpers import running_app, short_dir, sim_settings

LAST = 3  # of four devices: the only one left open


@pytest.fixture
async def client() -> AsyncIterator[tuple[AgentClient, App]]:
    with short_dir() as root:
        ports = Ports(
            gpu=FakeGpuBackend.with_gpus(LAST + 1),
            mps=FakeMpsManager(),
            telemetry=[FakeTelemetrySource()],
            simulated=True,
        )
        async with running_app(sim_settings(root), ports) as app:
            assert app.node is not None
            for device in app.devices[:LAST]:
                await app.node.drain(device.uuid, "keep leases on the last device")
            target = f"unix:{app.settings.unix_socket_path}"
            async with AgentClient(target, attempts=1) as agent:
                yield agent, app


def fields(name: str) -> dict[str, object]:
    return {
        "request_id": name, "tenant": "t", "trust_domain": "t",
        "priority": Priority.BURSTABLE, "memory_bytes": 4 * GIB, "thread_pct": 10.0,
    }  # fmt: skip


def check(lease: pb.Lease, app: App) -> None:
    assert lease.lease_id
    assert lease.device_uuid == app.devices[LAST].uuid
    assert lease.device_index == LAST


async def test_every_lease_answer_has_the_lease_s_device_index(
    client: tuple[AgentClient, App],
) -> None:
    agent, app = client
    admitted = await agent.admit(**fields("r-admit"))
    check(admitted.lease, app)
    batch = await agent.admit_batch([agent.request(**fields("r-batch"))])  # type: ignore[arg-type]
    check(batch.results[0].lease, app)
    reserved = await agent.reserve("g-commit", ttl_s=30, **fields("r-reserve"))
    check(reserved.lease, app)
    committed = await agent.commit("g-commit")
    check(committed.leases[0], app)
    await agent.reserve("g-abort", ttl_s=30, **fields("r-abort"))
    aborted = await agent.abort("g-abort")
    check(aborted.leases[0], app)
    node = await agent.get_node()
    assert node.leases and all(x.device_index == LAST for x in node.leases)
    released = await agent.release(admitted.lease.lease_id)
    check(released.lease, app)
