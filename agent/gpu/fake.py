"""Fakes of the GPU ports, shared by the simulated node and the tests.

Build them with :meth:`FakeGpuBackend.with_gpus`; make them fail with ``fail_with``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence

from agent.core.errors import GpuError
from agent.core.samples import Sample
from agent.core.types import Device, GpuProcess, SharingMode
from agent.core.units import GIB
from agent.gpu.port import GpuEventSink

IDLE_COUNTERS: Mapping[str, float] = {
    "gpu_util": 0.0,
    "mem_util": 0.0,
    "sm_active": 0.0,
    "fb_used_bytes": 0.0,
    "power_w": 70.0,
    "sm_clock_mhz": 345.0,
    "temperature_c": 32.0,
}


def fake_uuid(prefix: str, seed: str, position: int) -> str:
    """A stable UUID in NVIDIA's printed form (``GPU-xxxxxxxx-xxxx-...``) for a fake device."""
    digest = hashlib.sha256(f"{seed}/{position}".encode()).hexdigest()
    return f"{prefix}-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class FakeGpuBackend:
    """An in-memory device inventory."""

    name = "simulated"

    def __init__(self, devices: Sequence[Device]) -> None:
        self._devices = list(devices)
        self.started = False
        self.fail_with: GpuError | None = None
        self.exclusive: dict[str, bool] = {}
        self.process_table: dict[str, list[GpuProcess]] = {}
        self.events: asyncio.Queue[tuple[str, str, str | None, dict[str, str]]] = asyncio.Queue()
        self.driver: str | None = None  # a simulated node has no driver

    @classmethod
    def with_gpus(
        cls,
        count: int,
        *,
        model: str = "H100-SXM5-80GB",
        memory_bytes: int = 80 * GIB,
        minors: Sequence[int] | None = None,
    ) -> FakeGpuBackend:
        """``count`` GPUs; their minor numbers ``minors`` (by index), else their indexes."""
        numbers = list(range(count)) if minors is None else list(minors)
        if len(numbers) != count:
            raise ValueError(f"{count} GPUs need {count} minor numbers, not {len(numbers)}")
        devices = [
            Device(
                uuid=fake_uuid("GPU", model, i),
                index=i,
                model=model,
                memory_bytes=memory_bytes,
                sharing_mode=SharingMode.MPS,
                minor=numbers[i],
            )
            for i in range(count)
        ]
        return cls(devices)

    async def start(self) -> None:
        self.started = True

    async def driver_version(self) -> str | None:
        return self.driver

    async def aclose(self) -> None:
        self.started = False

    def unplug(self, uuid: str) -> Device:
        """The device is no longer listed (a GPU off the bus); :meth:`plug` brings it back."""
        device = next(d for d in self._devices if d.uuid == uuid)
        self._devices.remove(device)
        return device

    def plug(self, device: Device) -> None:
        self._devices.append(device)
        self._devices.sort(key=lambda d: d.index)

    async def list_devices(self) -> list[Device]:
        if self.fail_with is not None:
            raise self.fail_with
        return list(self._devices)

    async def set_compute_mode(self, device: Device, *, exclusive: bool) -> None:
        self.exclusive[device.uuid] = exclusive

    async def processes(self, device: Device) -> list[GpuProcess]:
        return list(self.process_table.get(device.uuid, []))

    async def watch_events(self, emit: GpuEventSink) -> None:
        """Deliver what tests put on ``events`` (kind, message, device UUID, attributes)."""
        while True:
            kind, message, device_uuid, attrs = await self.events.get()
            emit(kind, message, device_uuid, attrs)


class FakeTelemetrySource:
    """Counters from a function of (device, time); idle counters by default."""

    name = "simulated"

    def __init__(
        self,
        counters: Callable[[Device, float], Mapping[str, float]] | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.counters = counters or (lambda _device, _now: IDLE_COUNTERS)
        self._clock = clock
        self.fail_with: Exception | None = None
        self.reads = 0

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def read(self, devices: Sequence[Device]) -> list[Sample]:
        self.reads += 1
        if self.fail_with is not None:
            raise self.fail_with
        now = self._clock()
        return [Sample(d.uuid, now, self.counters(d, now)) for d in devices]
