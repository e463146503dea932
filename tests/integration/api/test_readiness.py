"""Readiness with real processes: a client carrying the lease marker in its environment
makes its lease ready (a lease bound to no workload: the marker is its only identity); a
lease whose client never comes becomes ineffective; W follows."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.control.processes import read_lease_hint
from agent.core.types import GpuProcess
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import Ports
from tests.helpers import running_app, short_dir, sim_settings


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def test_the_marker_is_read_from_the_process_environment() -> None:
    with subprocess.Popen(["sleep", "30"], env={**os.environ, "GPUSHARE_LEASE_ID": "l-abc"}) as p:
        try:
            # until exec, /proc shows the environment of the forked parent: wait for it
            for _ in range(100):
                if read_lease_hint(p.pid) is not None:
                    break
                time.sleep(0.01)
            assert read_lease_hint(p.pid) == "l-abc"
        finally:
            p.kill()
    assert read_lease_hint(os.getpid()) == os.environ.get("GPUSHARE_LEASE_ID")
    assert read_lease_hint(2**22 + 12345) is None  # no such process


async def test_ready_ineffective_and_w(root: Path) -> None:
    gpu = FakeGpuBackend.with_gpus(1)
    ports = Ports(gpu=gpu, mps=FakeMpsManager(), telemetry=[FakeTelemetrySource()], simulated=True)
    settings = sim_settings(
        root,
        **{"readiness.deadline_s": 1.0, "readiness.policy": "reclaim", "readiness.interval_s": 0.1},
    )
    async with running_app(settings, ports) as app:
        device = app.devices[0]
        async with grpc.aio.insecure_channel(f"unix:{settings.unix_socket_path}") as channel:
            stub = pb_grpc.AgentStub(channel)
            leases = []
            for request_id in ("comes", "never"):
                answer = await stub.Admit(
                    pb.AdmitRequest(
                        request=pb.Request(
                            request_id=request_id,
                            tenant="t",
                            trust_domain="a",
                            priority=pb.BURSTABLE,
                            memory_bytes=20 * GIB,
                            thread_pct=25,
                        )
                    )
                )
                leases.append(answer)
            w_before = (await stub.GetNode(pb.GetNodeRequest())).ineffective_ratio
            assert w_before == pytest.approx(40 / 80)
            env = {**os.environ, **dict(leases[0].env)}
            with subprocess.Popen(["sleep", "30"], env=env) as client:
                try:
                    gpu.process_table[device.uuid] = [GpuProcess(client.pid, 1 * GIB, mps=True)]
                    await asyncio.sleep(2.0)
                    node = await stub.GetNode(pb.GetNodeRequest())
                finally:
                    client.kill()
        states = {x.request_id: x.state for x in node.leases}
        assert states == {"comes": "ready"}, "the other one was reclaimed"
        kinds = [e.kind for e in app.events.since(0)]
        assert "lease.ready" in kinds and "lease.ineffective" in kinds
        assert node.ineffective_ratio == 0.0


async def test_simulated_counters_follow_the_leases_and_their_signatures(root: Path) -> None:
    from agent.runtime.wiring import SimCounters

    counters = SimCounters()
    ports = Ports(
        gpu=FakeGpuBackend.with_gpus(1),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource(counters)],
        simulated=True,
    )
    settings = sim_settings(
        root, **{"telemetry.sample_interval_s": 0.05, "telemetry.window_s": 0.2}
    )
    async with running_app(settings, ports) as app:
        device = app.devices[0]
        assert counters(device, 0.0)["sm_active"] == 0.0, "idle with nothing placed"
        async with grpc.aio.insecure_channel(f"unix:{settings.unix_socket_path}") as channel:
            await pb_grpc.AgentStub(channel).Admit(
                pb.AdmitRequest(
                    request=pb.Request(
                        request_id="busy",
                        tenant="t",
                        trust_domain="a",
                        priority=pb.BURSTABLE,
                        memory_bytes=6 * GIB,
                        thread_pct=100,
                        counters={"sm_active": 0.6, "dram_active": 0.2},
                    )
                )
            )
        now = counters(device, 0.0)
        assert now["sm_active"] == pytest.approx(0.6) and now["fb_used_bytes"] == 6 * GIB
        await asyncio.sleep(0.5)
        windows = {w.device_uuid: w for w in app.sampler.latest_windows()}  # type: ignore[union-attr]
        assert windows[device.uuid].mean["sm_active"] == pytest.approx(0.6)
