"""The agent's node service in the test's process, on fake GPUs (the CDI tests share their
devices through it), and a lease on one of those GPUs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from agent.core.lease import Lease
from agent.core.types import AdmissionRequest, Device, PriorityClass
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.node.service import NodeService
from agent.runtime.app import Ports
from tests.helpers import running_app, sim_settings


@contextlib.asynccontextmanager
async def node_of(root: Path, devices: Sequence[Device]) -> AsyncIterator[NodeService]:
    ports = Ports(
        gpu=FakeGpuBackend(devices),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )
    async with running_app(sim_settings(root, **{"estimator.model_dir": "none"}), ports) as app:
        assert app.node is not None
        yield app.node


async def lease_on(node: NodeService, device: Device) -> Lease:
    request = AdmissionRequest(
        f"r-{device.uuid}", "t", "t", PriorityClass.BURSTABLE, 4 * GIB, 25, device_uuid=device.uuid
    )
    result = await node.admit(request)
    assert result.lease is not None, result.decision
    return result.lease
