"""A lease whose device is gone at start (a GPU removed, MIG repartitioned) is failed with a
`lease.device_gone` event, not restored into no device's ledger."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.api.convert import snapshot_to_pb
from agent.cli.main import _status_text
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
        (gone,) = app.snapshot().gone_devices
        assert (gone.device_uuid, gone.leases_failed, gone.when) == (
            lease.device_uuid,
            1,
            "at start",
        )
        shown = _status_text(snapshot_to_pb(app.snapshot()))
        assert (
            "gone from this node (see gpushare events):\n"
            f"  {lease.device_uuid}: found gone at start, 1 lease(s) failed" in shown
        )
        assert await app.events.flush()
        kinds = [e.kind for e in app.events.since(0) if e.lease_id == lease.lease_id]
        assert kinds[-2:] in (
            ["lease.device_gone", "lease.failed"],
            ["lease.failed", "lease.device_gone"],
        )


async def test_a_device_gone_at_run_time_is_closed_and_its_leases_failed(root: Path) -> None:
    settings = sim_settings(root, **{"estimator.model_dir": "none"})
    gpus = ports(2)
    async with running_app(settings, gpus) as app:
        assert app.node is not None and app.control is not None
        await app.node.drain(app.devices[0].uuid, "keep the lease off device 0")
        request = AdmissionRequest("r-1", "t", "t", PriorityClass.BURSTABLE, 8 * GIB, 25)
        lease = (await app.node.admit(request)).lease
        assert lease is not None and lease.device_uuid == app.devices[1].uuid
        unplugged = gpus.gpu.unplug(lease.device_uuid)  # type: ignore[attr-defined]
        await app.control.janitor.pass_once(dry_run=False)
        assert lease.lease_id not in app.node.leases
        stored = await app.store.lease(lease.lease_id)
        assert stored is not None and stored.state is LeaseState.FAILED
        assert stored.reason == "its device is gone"
        await app.control.janitor.pass_once(dry_run=False)  # a second pass counts nothing twice
        (gone,) = app.snapshot().gone_devices
        assert (gone.leases_failed, gone.when) == (1, "at run time")
        ledger = {x.device_uuid: x for x in app.snapshot().ledger}[lease.device_uuid]
        assert (ledger.closed, ledger.closed_detail) == (
            "DEVICE_UNAVAILABLE",
            "the device is gone from the node",
        )
        refused = await app.node.admit(
            AdmissionRequest("r-2", "t", "t", PriorityClass.BURSTABLE, 8 * GIB, 25)
        )
        assert not refused.decision.admitted
        gpus.gpu.plug(unplugged)  # type: ignore[attr-defined]
        await app.control.janitor.pass_once(dry_run=False)
        ledger = {x.device_uuid: x for x in app.snapshot().ledger}[lease.device_uuid]
        assert ledger.closed == ""
        assert app.snapshot().gone_devices == ()
        assert await app.events.flush()
        kinds = [e.kind for e in app.events.since(0) if e.device_uuid == lease.device_uuid]
        assert {"device.gone", "lease.device_gone", "lease.failed", "device.back"} <= set(kinds)
        assert kinds.index("device.gone") < kinds.index("device.back")
