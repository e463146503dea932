"""A process that names another lease: readiness and the janitor on the simulated node.

Real tenant processes carry ``GPUSHARE_LEASE_ID`` in their environment (read by the real
/proc reader); their cgroups are given per PID (the real cgroup reader is tested in
test_process_identity.py and the parsing in tests/unit/core/test_identity.py). The victim's
lease is bound to its pod; the liar runs in another pod and names the victim's lease.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent.control import processes
from agent.control.processes import read_lease_hint
from agent.core.identity import CgroupFacts
from agent.core.lease import Lease, LeaseState
from agent.core.types import AdmissionRequest, Event, GpuProcess, PriorityClass
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import App, Ports
from agent.runtime.wiring import SimCounters
from tests.helpers import FakeClock, running_app, short_dir, sim_settings

POD_VICTIM = "7d4424e6-bb13-42f4-a47a-45a4828bf54d"
POD_LIAR = "a5c1f8d5-1919-434d-add7-4afaafdaef89"
CTR_VICTIM = "d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98"
CTR_LIAR = "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c"
IN_VICTIM_POD = CgroupFacts(POD_VICTIM, CTR_VICTIM)
IN_LIAR_POD = CgroupFacts(POD_LIAR, CTR_LIAR)


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
async def app(root: Path) -> AsyncIterator[App]:
    clock = FakeClock()
    ports = Ports(
        gpu=FakeGpuBackend.with_gpus(1),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource(SimCounters(), clock=clock)],
        simulated=True,
    )
    settings = sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            "janitor.interval_s": 3600,
            "janitor.memory_policy": "enforce",
            "readiness.interval_s": 3600,
        },
    )
    async with running_app(settings, ports, clock=clock) as running:
        yield running


async def admit(app: App, name: str, workload: str) -> Lease:
    assert app.node is not None
    result = await app.node.admit(
        AdmissionRequest(name, "t", "a", PriorityClass.BEST_EFFORT, 8 * GIB, 25, workload=workload)
    )
    assert result.lease is not None, result.decision.message
    return result.lease


@contextmanager
def tenant(lease_id: str) -> Iterator[int]:
    """A real process whose environment names ``lease_id``, once it has exec'd."""
    env = {**os.environ, "GPUSHARE_LEASE_ID": lease_id, "SECRET": "s3cret"}
    with subprocess.Popen(["sleep", "30"], env=env) as process:
        try:
            for _ in range(200):
                if read_lease_hint(process.pid) == lease_id:
                    break
                time.sleep(0.01)
            yield process.pid
        finally:
            process.kill()


def cgroups(monkeypatch: pytest.MonkeyPatch, facts: dict[int, CgroupFacts]) -> None:
    monkeypatch.setattr(processes, "read_cgroup", lambda pid: facts.get(pid, CgroupFacts()))


def on_device(app: App, used: dict[int, int]) -> str:
    """The PIDs as MPS clients and NVML processes of the device; the device."""
    device = app.devices[0].uuid
    gpu, mps = app.ports.gpu, app.ports.mps
    assert isinstance(gpu, FakeGpuBackend) and isinstance(mps, FakeMpsManager)
    for pid in used:
        mps.connect(device, pid)
    gpu.process_table[device] = [GpuProcess(pid, b, mps=True) for pid, b in used.items()]
    return device


async def mismatches(app: App) -> list[Event]:
    assert await app.events.flush()
    return [e for e in app.events.since(0) if e.kind == "lease.identity_mismatch"]


async def test_naming_another_pods_lease_makes_it_not_ready_and_is_reported_once(
    app: App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert app.node is not None and app.control is not None
    victim = await admit(app, "victim", f"pod:{POD_VICTIM}")
    with tenant(victim.lease_id) as liar:
        cgroups(monkeypatch, {liar: IN_LIAR_POD})
        on_device(app, {liar: GIB})
        with caplog.at_level(logging.WARNING, logger="agent.control.attribution"):
            await app.control.readiness.check_once()
            await app.control.readiness.check_once()
            await app.control.janitor.pass_once(dry_run=False)
        assert app.node.leases[victim.lease_id].state is LeaseState.ADMITTED
        (event,) = await mismatches(app)
    assert event.lease_id == victim.lease_id
    assert event.attrs["pid"] == str(liar) and event.attrs["hinted_lease_id"] == victim.lease_id
    assert POD_LIAR in event.attrs["cgroup"] and event.attrs["attributed_lease_id"] == ""
    attributor = app.control.janitor.attributor
    assert app.control.readiness.attributor is attributor
    assert attributor.mismatches_total == 1, "once between readiness and the janitor"
    (line,) = [r for r in caplog.records if "SECURITY" in r.getMessage()]
    assert line.levelno == logging.WARNING and str(liar) in line.getMessage()


async def test_the_victims_own_process_makes_it_ready(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert app.node is not None and app.control is not None
    victim = await admit(app, "victim", f"pod:{POD_VICTIM}")
    with tenant(victim.lease_id) as own:
        cgroups(monkeypatch, {own: IN_VICTIM_POD})
        on_device(app, {own: GIB})
        await app.control.readiness.check_once()
        assert app.node.leases[victim.lease_id].state is LeaseState.READY
    assert await mismatches(app) == []


async def test_under_enforce_a_liar_never_gets_the_victims_clients_terminated(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert app.node is not None and app.control is not None
    victim = await admit(app, "victim", f"pod:{POD_VICTIM}")  # an 8 GiB limit
    mps = app.ports.mps
    assert isinstance(mps, FakeMpsManager)
    with tenant(victim.lease_id) as own, tenant(victim.lease_id) as liar:
        cgroups(monkeypatch, {own: IN_VICTIM_POD, liar: IN_LIAR_POD})
        on_device(app, {own: 2 * GIB, liar: 9 * GIB})
        await app.control.readiness.check_once()
        assert app.node.leases[victim.lease_id].state is LeaseState.READY
        first = await app.control.janitor.pass_once(dry_run=False)
        await app.control.janitor.pass_once(dry_run=False)
    assert mps.terminated == [], "nothing of the victim's is touched"
    assert not [x for x in first if "over its limit" in x], "the liar's memory is not its"
    assert [x for x in first if f"report client {liar}" in x], "the liar is nobody's client"
    assert len(await mismatches(app)) == 1


async def test_under_enforce_a_hint_only_lease_is_reported_never_enforced(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease bound to no workload keeps the hint as its only identity: the liar makes it
    ready and over its limit, but no client is terminated on the hint's word."""
    assert app.node is not None and app.control is not None
    victim = await admit(app, "victim", "")
    mps = app.ports.mps
    assert isinstance(mps, FakeMpsManager)
    with tenant(victim.lease_id) as own, tenant(victim.lease_id) as liar:
        cgroups(monkeypatch, {own: IN_VICTIM_POD, liar: IN_LIAR_POD})
        on_device(app, {own: 2 * GIB, liar: 9 * GIB})
        await app.control.readiness.check_once()
        planned = await app.control.janitor.pass_once(dry_run=False)
    (violation,) = [x for x in planned if "over its limit" in x]
    assert "2 client(s) known by their GPUSHARE_LEASE_ID only" in violation
    assert mps.terminated == []
    assert await mismatches(app) == [], "no workload to contradict"


async def test_under_enforce_a_bound_lease_over_its_limit_loses_its_own_clients(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert app.node is not None and app.control is not None
    hungry = await admit(app, "hungry", f"container:{CTR_VICTIM[:12]}")
    mps = app.ports.mps
    assert isinstance(mps, FakeMpsManager)
    with tenant(hungry.lease_id) as own, tenant(hungry.lease_id) as liar:
        cgroups(monkeypatch, {own: IN_VICTIM_POD, liar: IN_LIAR_POD})
        device = on_device(app, {own: 9 * GIB, liar: GIB})
        await app.control.janitor.pass_once(dry_run=False)
        server = mps.states()[0].servers[0].pid
    assert mps.terminated == [(device, server, own)], "its own client only, not the liar"
