"""NVML on a real GPU: inventory (with MIG instances), processes, counters, events.
Skipped with a reason where there is no NVIDIA driver."""

from __future__ import annotations

import asyncio

import pytest

from agent.gpu.nvml import NvmlGpuBackend
from agent.gpu.nvml_counters import NvmlTelemetry

pytestmark = pytest.mark.gpu


async def test_inventory_processes_counters_and_events() -> None:
    backend = NvmlGpuBackend()
    await backend.start()
    try:
        devices = await backend.list_devices()
        assert devices
        for device in devices:
            assert device.uuid.startswith(("GPU-", "MIG-")) and device.memory_bytes > 0
            assert (device.parent_uuid is None) == device.uuid.startswith("GPU-")
            processes = await backend.processes(device)
            assert all(p.pid > 0 for p in processes)
        samples = await NvmlTelemetry().read(devices)
        assert {s.device_uuid for s in samples} == {d.uuid for d in devices}
        for sample, device in zip(samples, devices, strict=True):
            assert 0 <= sample.counters["fb_used_bytes"] <= device.memory_bytes
            if device.parent_uuid is None:
                assert 0 <= sample.counters.get("gpu_util", 0) <= 100
                assert sample.counters.get("power_w", 1) > 0
        events: list[str] = []
        watcher = asyncio.create_task(
            backend.watch_events(lambda kind, *_rest: events.append(kind))
        )
        await asyncio.sleep(1.5)
        assert not watcher.done(), "the NVML event loop must keep running"
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    finally:
        await backend.aclose()
