"""NVML as a counter source: the fallback when neither DCGM nor dcgm-exporter is there.

Reads utilisation, memory, power, clocks, temperature and throttle reasons per device (MIG
instances: memory only, NVML has no utilisation for them). Blocking calls run in a worker
thread; NVML must already be initialised by :class:`~agent.gpu.nvml.NvmlGpuBackend`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from agent.core.samples import Sample
from agent.core.types import Device
from agent.gpu.nvml import call, optional


class NvmlTelemetry:
    name = "nvml"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def read(self, devices: Sequence[Device]) -> list[Sample]:
        return await asyncio.to_thread(self._read, list(devices))

    def _read(self, devices: list[Device]) -> list[Sample]:
        now = self._clock()
        return [Sample(d.uuid, now, _counters(d)) for d in devices]


def _counters(device: Device) -> dict[str, float]:
    handle = call(f"open {device.uuid}", pynvml.nvmlDeviceGetHandleByUUID, device.uuid)
    counters: dict[str, float] = {}
    memory = call(f"read memory of {device.uuid}", pynvml.nvmlDeviceGetMemoryInfo, handle)
    counters["fb_used_bytes"] = float(memory.used)
    counters["fb_free_bytes"] = float(memory.free)
    if device.is_mig:
        return counters
    rates = optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
    if rates is not None:
        counters["gpu_util"], counters["mem_util"] = float(rates.gpu), float(rates.memory)
    _put(counters, "power_w", optional(pynvml.nvmlDeviceGetPowerUsage, handle), 1e-3)
    _put(
        counters,
        "sm_clock_mhz",
        optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
    )
    _put(
        counters,
        "mem_clock_mhz",
        optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
    )
    _put(counters, "temperature_c", _temperature(handle))
    _put(
        counters,
        "clocks_event_reasons",
        optional(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle),
    )
    return counters


def _put(counters: dict[str, float], name: str, value: Any, scale: float = 1.0) -> None:
    if value is not None:
        counters[name] = float(value) * scale


def _temperature(handle: Any) -> float | None:
    value = optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
    return None if value is None else float(value)
