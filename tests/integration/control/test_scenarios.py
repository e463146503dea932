"""Scenarios of the control loops on the simulated node with a controllable clock.

The App runs in this event loop with the fake GPU, the in-memory MPS manager and the
simulated counters (the sim's contention model over the leases placed, plus injected
misbehaviour). The clock moves only when a test says so; a window closes when the next
sample is taken, so tests step windows instantly. The retention gate runs its stated
fallback (the utilisation-sum rule), whose numbers a reader can check by hand.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent.core.errors import TelemetryError
from agent.core.identity import CgroupFacts, ProcessIdentity
from agent.core.lease import Lease, LeaseState
from agent.core.types import AdmissionRequest, GpuProcess, PriorityClass, ReasonCode
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import App, Ports
from agent.runtime.wiring import SimCounters
from tests.helpers import FakeClock, running_app, short_dir, sim_settings

WINDOW_S = 10.0
G, BE = PriorityClass.GUARANTEED, PriorityClass.BEST_EFFORT


def signature(sm: float, dram: float) -> dict[str, float]:
    return {"sm_active": sm, "dram_active": dram, "gpu_util": 110 * sm, "mem_util": 100 * dram}


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


class Node:
    def __init__(self, app: App, clock: FakeClock, counters: SimCounters) -> None:
        self.app, self.clock, self.counters = app, clock, counters
        self.device = app.devices[0].uuid
        assert app.node is not None and app.control is not None and app.sampler is not None
        self.node, self.control, self.sampler = app.node, app.control, app.sampler
        self.mps = app.ports.mps
        assert isinstance(self.mps, FakeMpsManager)
        self.fake_mps = self.mps

    async def admit(
        self,
        name: str,
        priority: PriorityClass,
        counters: dict[str, float],
        *,
        thread_pct: float = 25,
        floor: float | None = None,
    ) -> Lease:
        result = await self.node.admit(
            AdmissionRequest(
                name,
                "t",
                "a",
                priority,
                8 * GIB,
                thread_pct,
                retention_floor=floor,
                counters=counters,
            )
        )
        assert result.decision.admitted, result.decision.message
        assert result.lease is not None
        self.clock.advance(1)  # leases are told apart by age
        return result.lease

    async def windows(self, count: int) -> None:
        """Run ``count`` windows: one sample in the middle of each, closed at its end."""
        for _ in range(count):
            start = (self.clock.now // WINDOW_S + 1) * WINDOW_S
            self.clock.now = start + WINDOW_S / 2
            await self.sampler.sample_once()
            self.clock.now = start + WINDOW_S
            self.sampler.close_due_windows()
        await self.control.degradation.settled()

    async def kinds(self) -> list[str]:
        """The kinds of the events published so far, once what was observed is written."""
        assert await self.app.events.flush()
        return [e.kind for e in self.app.events.since(0)]

    def closed(self) -> ReasonCode | None:
        return next(v.closed for v in self.node.views() if v.device.uuid == self.device)


@pytest.fixture
async def sim(root: Path) -> AsyncIterator[Node]:
    clock = FakeClock()
    counters = SimCounters()
    ports = Ports(
        gpu=FakeGpuBackend.with_gpus(1),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource(counters, clock=clock)],
        simulated=True,
    )
    settings = sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            "telemetry.sample_interval_s": WINDOW_S,
            "telemetry.window_s": WINDOW_S,
            "telemetry.stale_after_s": 3 * WINDOW_S,
            "janitor.interval_s": 3600,
            "janitor.exit_grace_s": 30,
            "readiness.interval_s": 3600,
            "readiness.deadline_s": 600,
            "readiness.policy": "reclaim",
            "degradation.windows": 3,
            "degradation.cooldown_windows": 3,
        },
    )
    async with running_app(settings, ports, clock=clock) as app:
        yield Node(app, clock, counters)


async def three_tenants(sim: Node) -> tuple[Lease, Lease, Lease]:
    """A protected lease (floor 0.95) and two best-effort ones, all admitted: their declared
    gpu_util adds up to 71.5, so the fallback rule predicts 1.0 for each."""
    protected = await sim.admit("p", G, signature(0.45, 0.2), thread_pct=50, floor=0.95)
    older = await sim.admit("be-old", BE, signature(0.1, 0.05), thread_pct=20)
    younger = await sim.admit("be-young", BE, signature(0.1, 0.05), thread_pct=50)
    await sim.windows(1)  # a first window with all three running as declared
    return protected, older, younger


async def test_interference_for_w_windows_degrades_evicts_the_youngest_once_and_recovers(
    sim: Node,
) -> None:
    protected, older, younger = await three_tenants(sim)
    client = 2**22 + 99
    server = sim.fake_mps.connect(sim.device, client)
    younger = await sim.node.mark_ready(younger, [client])
    # The young lease runs five times busier than it declared: the device measures more
    # than the signatures explain, and the protected lease's estimate falls under 0.95.
    sim.counters.behaviour[younger.lease_id] = signature(0.5, 0.05)
    await sim.windows(2)
    assert sim.closed() is None, "two windows under floor are not w = 3"
    await sim.windows(1)
    assert sim.closed() is ReasonCode.DEVICE_DEGRADED
    assert sim.node.leases.get(younger.lease_id) is None, "the youngest best-effort lease"
    ended = await sim.app.store.lease_by_request("be-young")
    assert ended is not None and ended.state is LeaseState.EVICTED
    assert set(sim.node.leases) == {protected.lease_id, older.lease_id}
    assert sim.control.actions["evict"] == 1 and sim.control.actions["degrade"] == 1
    assert sim.fake_mps.terminated == [(sim.device, server, client)], "its client ended first"
    (history,) = await sim.app.store.history()
    assert (history.lease_id, history.final_state) == (younger.lease_id, "evicted")
    assert history.became_ready and history.attributes["priority"] == "best-effort"
    refused = await sim.node.explain(
        AdmissionRequest("late", "t", "a", BE, GIB, 1, counters=signature(0.01, 0.01))
    )
    assert refused.decision.reason is ReasonCode.DEVICE_DEGRADED
    # With the culprit gone the estimates are back at 1.0 = floor + margin: w windows later
    # the device recovers, and nothing else was evicted on the way.
    await sim.windows(2)
    assert sim.closed() is ReasonCode.DEVICE_DEGRADED
    await sim.windows(1)
    assert sim.closed() is None
    assert sim.control.actions["recover"] == 1 and sim.control.actions["evict"] == 1
    assert (await sim.kinds()).count("lease.evicted") == 1
    assert "degradation.recover" in (await sim.kinds())


async def test_a_dip_shorter_than_w_windows_does_nothing(sim: Node) -> None:
    _protected, _older, younger = await three_tenants(sim)
    sim.counters.behaviour[younger.lease_id] = signature(0.5, 0.05)
    await sim.windows(2)
    del sim.counters.behaviour[younger.lease_id]
    await sim.windows(5)
    assert sim.closed() is None
    assert len(sim.node.leases) == 3
    assert not [k for k in (await sim.kinds()) if k.startswith("degradation.")]


async def test_stale_telemetry_does_nothing(sim: Node) -> None:
    _protected, _older, younger = await three_tenants(sim)
    sim.counters.behaviour[younger.lease_id] = signature(0.5, 0.05)
    source = sim.app.telemetry
    assert isinstance(source, FakeTelemetrySource)
    source.fail_with = TelemetryError("exporter gone")
    await sim.windows(6)
    assert sim.closed() is None and len(sim.node.leases) == 3
    # Back after a long gap: the window that closes now is old, and pauses the rule.
    source.fail_with = None
    sim.clock.advance(10 * WINDOW_S)
    await sim.windows(1)
    assert sim.closed() is None and len(sim.node.leases) == 3
    assert not [k for k in (await sim.kinds()) if k.startswith("degradation.")]


async def test_a_dead_client_is_terminated_exactly_once(sim: Node) -> None:
    lease = await sim.admit("job", G, signature(0.3, 0.1))
    dead_pid = 2**22 + 4321  # above pid_max on common kernels: no such process
    server = sim.fake_mps.connect(sim.device, dead_pid)
    assert await sim.control.janitor.pass_once(dry_run=True) == [
        f"terminate client {dead_pid} of server {server} on {sim.device}: process gone"
    ]
    assert sim.fake_mps.terminated == [], "a dry run changes nothing"
    await sim.control.janitor.pass_once(dry_run=False)
    await sim.control.janitor.pass_once(dry_run=False)
    assert sim.fake_mps.terminated == [(sim.device, server, dead_pid)]
    assert (await sim.kinds()).count("janitor.terminate") == 1
    assert lease.lease_id in sim.node.leases, "the lease itself is not the janitor's to end"


async def test_a_fatal_fault_fails_the_leases_clears_the_server_and_the_device_admits_again(
    sim: Node,
) -> None:
    first = await sim.admit("one", BE, signature(0.2, 0.1))
    second = await sim.admit("two", BE, signature(0.2, 0.1))
    server = sim.fake_mps.connect(sim.device, 2**22 + 1)
    sim.app.events(
        "mps.server_fatal", "Server encountered a fatal exception", device_uuid=sim.device
    )
    assert sim.closed() is ReasonCode.DEVICE_UNAVAILABLE, "closed from the moment it is seen"
    await sim.control.janitor.pass_once(dry_run=False)
    for lease in (first, second):
        ended = await sim.app.store.lease_by_request(lease.request_id)
        assert ended is not None and ended.state is LeaseState.FAILED
    assert sim.fake_mps.terminated == [(sim.device, server, 2**22 + 1)]
    assert sim.fake_mps.shut_down == [(sim.device, server)]
    assert sim.closed() is None
    again = await sim.admit("three", BE, signature(0.2, 0.1))
    assert again.device_uuid == sim.device
    assert "device.fault_cleared" in (await sim.kinds())


async def test_a_lease_whose_client_never_connects_is_ineffective_at_its_deadline(
    sim: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sim.admit("never", BE, signature(0.2, 0.1))
    other = await sim.admit("comes", BE, signature(0.2, 0.1))
    total = sim.app.devices[0].memory_bytes
    assert sim.app.snapshot().ineffective_ratio == pytest.approx(16 * GIB / total)
    sim.app.ports.gpu.process_table[sim.device] = [  # type: ignore[attr-defined]
        GpuProcess(2**22 + 7, GIB, mps=True)
    ]
    # The client's identity as /proc would show it: its marker, and a cgroup that names no
    # workload (the lease is bound to none). Real reads are tested with real processes in
    # tests/integration/control/test_process_identity.py.
    monkeypatch.setattr(
        "agent.control.processes.read_identity",
        lambda pid: (
            ProcessIdentity(pid, 1, CgroupFacts(), other.lease_id) if pid == 2**22 + 7 else None
        ),
    )
    await sim.control.readiness.check_once()
    assert sim.app.snapshot().ineffective_ratio == pytest.approx(8 * GIB / total)
    sim.clock.advance(597)  # "never" was admitted 2 s ago: 1 s before its deadline
    await sim.control.readiness.check_once()
    assert len(sim.node.leases) == 2
    sim.clock.advance(2)
    await sim.control.readiness.check_once()
    states = {x.request_id: x.state for x in sim.node.leases.values()}
    assert states == {"comes": LeaseState.READY}
    assert sim.app.snapshot().ineffective_ratio == 0.0


async def test_a_lease_over_its_memory_limit_is_a_violation_reported_once(sim: Node) -> None:
    lease = await sim.admit("hungry", BE, signature(0.2, 0.1))  # an 8 GiB limit
    env = {**os.environ, "GPUSHARE_LEASE_ID": lease.lease_id}
    with subprocess.Popen(["sleep", "30"], env=env) as client:
        try:
            for _ in range(100):  # until exec, /proc shows the parent's environment
                if "GPUSHARE_LEASE_ID" in Path(f"/proc/{client.pid}/environ").read_text():
                    break
                time.sleep(0.01)
            sim.fake_mps.connect(sim.device, client.pid)
            gpu = sim.app.ports.gpu
            assert isinstance(gpu, FakeGpuBackend)
            gpu.process_table[sim.device] = [GpuProcess(client.pid, 9 * GIB, mps=True)]
            planned = await sim.control.janitor.pass_once(dry_run=True)
            assert planned == [
                f"lease {lease.lease_id} uses 9.0 GiB of device memory, over its limit 8.0 GiB"
            ]
            await sim.control.janitor.pass_once(dry_run=False)
            await sim.control.janitor.pass_once(dry_run=False)
        finally:
            client.kill()
    assert (await sim.kinds()).count("janitor.memory-violation") == 1
    assert sim.control.actions["memory-violation"] == 1
    assert sim.fake_mps.terminated == [], "policy report: its client keeps running"
