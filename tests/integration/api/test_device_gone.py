"""A lease whose device is gone at start (a GPU removed, MIG repartitioned) is failed with a
`lease.device_gone` event, not restored into no device's ledger."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.core.lease import LeaseState
from agent.core.types import AdmissionRequest, PriorityClass
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import Ports
from tests.helpers import running_app, short_dir, sim_settings


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def ports(gpus: int) -> Ports:
    return Ports(
        gpu=FakeGpuBackend.with_gpus(gpus),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )


async def test_a_lease_on_a_vanished_device_is_failed_with_an_event(root: Path) -> None:
    settings = sim_settings(root, **{"estimator.model_dir": "none"})
    async with running_app(settings, ports(2)) as app:
        assert app.node is not None
        await app.node.drain(app.devices[0].uuid, "keep the lease off device 0")
        request = AdmissionRequest("r-1", "t", "t", PriorityClass.BURSTABLE, 8 * GIB, 25)
        lease = (await app.node.admit(request)).lease
        assert lease is not None and lease.device_uuid == app.devices[1].uuid
    async with running_app(settings, ports(1)) as app:  # device 1 is gone
        assert app.node is not None
        assert lease.lease_id not in app.node.leases
        assert all(x.device_uuid != lease.device_uuid for x in app.snapshot().leases)
        stored = await app.store.lease(lease.lease_id)
        assert stored is not None and stored.state is LeaseState.FAILED
        assert stored.reason == "its device is gone"
        assert await app.events.flush()
        kinds = [e.kind for e in app.events.since(0) if e.lease_id == lease.lease_id]
        assert kinds[-2:] in (
            ["lease.device_gone", "lease.failed"],
            ["lease.failed", "lease.device_gone"],
        )
