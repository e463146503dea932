"""The real gRPC server on a Unix socket and the real HTTP server on loopback, in-process,
with the simulated node's fakes."""

import asyncio
import stat
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.errors import TelemetryError
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import App, Ports
from tests.helpers import running_app, short_dir, sim_settings


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def fake_ports(count: int = 3) -> Ports:
    return Ports(
        gpu=FakeGpuBackend.with_gpus(count),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )


async def http_get(app: App, path: str) -> tuple[int, str]:
    assert app.http is not None and app.http.port
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{app.http.port}{path}") as response,
    ):
        return response.status, await response.text()


async def test_get_node_health_and_reflection_over_the_unix_socket(root: Path) -> None:
    settings = sim_settings(root)
    async with running_app(settings, fake_ports(3)):
        socket = Path(settings.unix_socket_path)
        assert stat.S_IMODE(socket.stat().st_mode) == 0o660
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            node = await pb_grpc.AgentStub(channel).GetNode(pb.GetNodeRequest(), timeout=5)
            assert node.simulated and len(node.devices) == 3
            assert [d.index for d in node.devices] == [0, 1, 2]
            assert all(m.up for m in node.mps) and len(node.mps) == 3
            assert {s.device_uuid for s in node.latest_samples} == {d.uuid for d in node.devices}

            health = health_pb2_grpc.HealthStub(channel)
            answer = await health.Check(
                health_pb2.HealthCheckRequest(service="gpushare.v1.Agent"), timeout=5
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            replies = [r async for r in reflection.ServerReflectionInfo(iter([request]))]
            names = {s.name for r in replies for s in r.list_services_response.service}
            assert {"gpushare.v1.Agent", "grpc.health.v1.Health"} <= names
    assert not socket.exists(), "the socket is removed on a clean stop"


async def test_http_health_readiness_and_metrics(root: Path) -> None:
    ports = fake_ports(2)
    async with running_app(sim_settings(root), ports) as app:
        assert await http_get(app, "/healthz") == (200, '{"status": "ok"}')
        status, body = await http_get(app, "/readyz")
        assert status == 200, body

        status, metrics = await http_get(app, "/metrics")
        assert status == 200
        assert metrics.count("gpushare_device_memory_bytes{") == 2
        assert 'gpushare_mps_daemon_up{backend="simulated"' in metrics

        assert isinstance(ports.mps, FakeMpsManager)
        down = app.snapshot().devices[1].uuid
        ports.mps.mark_down(down, "killed by the test")
        status, body = await http_get(app, "/readyz")
        assert status == 503
        assert down in body and "killed by the test" in body


async def test_stale_telemetry_makes_the_node_unready(root: Path) -> None:
    ports = fake_ports(1)
    settings = sim_settings(
        root,
        **{
            "telemetry.sample_interval_s": 0.02,
            "telemetry.window_s": 1,
            "telemetry.stale_after_s": 0.1,
        },
    )
    async with running_app(settings, ports) as app:
        source = ports.telemetry[0]
        assert isinstance(source, FakeTelemetrySource)
        source.fail_with = TelemetryError("source gone")
        await asyncio.sleep(0.3)
        status, body = await http_get(app, "/readyz")
        assert status == 503 and "telemetry stale" in body
        source.fail_with = None
        await asyncio.sleep(0.1)
        assert (await http_get(app, "/readyz"))[0] == 200
        assert app.sampler is not None and app.sampler.errors_total > 0


async def test_crashed_core_task_stops_the_app_with_exit_code_1(root: Path) -> None:
    ports = fake_ports(1)
    source = ports.telemetry[0]
    assert isinstance(source, FakeTelemetrySource)
    app = App(sim_settings(root, **{"telemetry.sample_interval_s": 0.01}), ports=ports)
    task = asyncio.create_task(app.run())
    await asyncio.wait_for(app.ready.wait(), 5)
    source.fail_with = ZeroDivisionError("a bug in the source")  # not a GpushareError
    assert await asyncio.wait_for(task, 10) == 1
    assert not Path(app.settings.unix_socket_path).exists()


async def test_start_up_failure_releases_everything(root: Path) -> None:
    ports = fake_ports(1)
    assert isinstance(ports.gpu, FakeGpuBackend)
    from agent.core.errors import GpuUnavailableError

    ports.gpu.fail_with = GpuUnavailableError("no driver")
    settings = sim_settings(root)
    with pytest.raises(GpuUnavailableError):
        await App(settings, ports=ports).run()
    # the lock is free again: a second app can start on the same socket
    async with running_app(settings, fake_ports(1)):
        pass


async def test_http_port_in_use_fails_start_up_clearly_and_releases_the_socket(root: Path) -> None:
    import socket

    from agent.core.errors import GpushareError

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        settings = sim_settings(root, **{"api.http_listen": f"127.0.0.1:{port}"})
        with pytest.raises(GpushareError, match=f"cannot serve HTTP on 127.0.0.1:{port}"):
            await App(settings, ports=fake_ports(1)).run()
    finally:
        taken.close()
    assert not Path(settings.unix_socket_path).exists()
    async with running_app(settings, fake_ports(1)):
        pass


async def test_stop_during_start_up_abandons_it_and_exits_0(root: Path) -> None:
    class SlowGpu(FakeGpuBackend):
        async def start(self) -> None:
            await asyncio.sleep(60)

    ports = fake_ports(1)
    ports.gpu = SlowGpu([])
    app = App(sim_settings(root), ports=ports)
    task = asyncio.create_task(app.run())
    await asyncio.sleep(0.2)
    app.request_stop()
    assert await asyncio.wait_for(task, 5) == 0


async def test_telemetry_falls_back_to_the_next_source_and_says_which(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(FakeTelemetrySource):
        name = "dcgm"

        async def start(self) -> None:
            raise TelemetryError("no host engine")

    ports = fake_ports(2)
    ports.telemetry = [Broken(), FakeTelemetrySource()]
    settings = sim_settings(
        root, **{"telemetry.window_s": 0.2, "telemetry.sample_interval_s": 0.05}
    )
    with caplog.at_level("INFO"):
        async with running_app(settings, ports) as app:
            await asyncio.sleep(0.5)
            async with grpc.aio.insecure_channel(f"unix:{settings.unix_socket_path}") as ch:
                node = await pb_grpc.AgentStub(ch).GetNode(pb.GetNodeRequest(), timeout=5)
            assert app.telemetry is ports.telemetry[1]
    assert "telemetry source: simulated (skipped dcgm: no host engine)" in caplog.text
    assert node.telemetry_source == "simulated" and not node.stale_devices
    assert {w.device_uuid for w in node.latest_windows} == {d.uuid for d in node.devices}
    assert all(w.sample_count >= 2 and w.window_s == 0.2 for w in node.latest_windows)
