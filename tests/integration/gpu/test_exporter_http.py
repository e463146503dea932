"""ExporterTelemetry against a real local HTTP server serving the recorded samples, and the
faults a scrape meets: a 500, a timeout, a truncated body, an unknown GPU."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from agent.core.types import Device
from agent.core.units import GIB
from agent.gpu.exporter import ExporterTelemetry
from agent.gpu.sampler import Sampler

DATA = Path(__file__).parents[2] / "data" / "telemetry"
KNOWN = Device("GPU-55274b56-9033-f166-7723-77088b0ff94d", 0, "TITAN V", 12 * GIB)
SECOND = Device("GPU-dad58a68-8239-6bb7-1f07-539b85fabfee", 1, "TITAN V", 12 * GIB)
UNKNOWN = Device("GPU-00000000-dead-beef-0000-000000000000", 2, "TITAN V", 12 * GIB)


class Exporter:
    """A stand-in dcgm-exporter whose behaviour a test switches at will."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.hits = 0

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        if self.mode == "500":
            return web.Response(status=500, text="exporter broke")
        if self.mode == "slow":
            await asyncio.sleep(1)
        text = (DATA / "exporter-F.txt").read_text()
        if self.mode == "truncated":
            response = web.StreamResponse(headers={"Content-Length": str(len(text) + 500)})
            await response.prepare(request)
            await response.write(text[:80].encode())
            request.transport.close()  # type: ignore[union-attr]
            return response
        return web.Response(text=text, content_type="text/plain")


@pytest.fixture
async def exporter() -> AsyncIterator[tuple[Exporter, str]]:
    fake = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}/metrics"
    await runner.cleanup()


async def test_scrape_maps_series_to_known_devices(exporter: tuple[Exporter, str]) -> None:
    _fake, url = exporter
    source = ExporterTelemetry(url, timeout_s=1.0, clock=lambda: 42.0)
    await source.start()
    try:
        samples = await source.read([KNOWN, SECOND])
    finally:
        await source.aclose()
    assert [(s.device_uuid, s.taken_at, dict(s.counters)) for s in samples] == [
        (KNOWN.uuid, 42.0, {"sm_clock_mhz": 135.0}),
        (SECOND.uuid, 42.0, {"sm_clock_mhz": 135.0}),
    ]


@pytest.mark.parametrize("mode", ["500", "slow", "truncated"])
async def test_faults_make_devices_stale_and_never_crash_the_sampler(
    exporter: tuple[Exporter, str], mode: str
) -> None:
    fake, url = exporter
    now = [1000.0]
    source = ExporterTelemetry(url, timeout_s=0.3, clock=lambda: now[0])
    sampler = Sampler(source, [KNOWN, UNKNOWN], interval_s=1.0, window_s=10.0, clock=lambda: now[0])
    await source.start()
    try:
        await sampler.sample_once()
        assert sampler.stale_devices(stale_after_s=5) == [UNKNOWN.uuid], (
            "a GPU the exporter does not report is stale from the start"
        )
        fake.mode = mode
        for _ in range(3):
            now[0] += 2
            await sampler.sample_once()
        assert sampler.errors_total == 3 and not sampler.up
        assert sampler.stale_devices(stale_after_s=5) == [KNOWN.uuid, UNKNOWN.uuid]
        fake.mode = "ok"
        now[0] += 1
        await sampler.sample_once()
        assert sampler.up and sampler.stale_devices(stale_after_s=5) == [UNKNOWN.uuid]
    finally:
        await source.aclose()
