"""Ports of the GPU domain. Adapters: NVML and DCGM (real nodes), fakes (simulated node)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from agent.core.samples import Sample
from agent.core.types import Device, GpuProcess

# kind, message, device UUID, attributes
GpuEventSink = Callable[[str, str, str | None, Mapping[str, str]], None]


class GpuBackend(Protocol):
    """The node's device inventory. ``start`` initialises the library; constructors do no I/O."""

    name: str

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def list_devices(self) -> list[Device]: ...

    async def driver_version(self) -> str | None:
        """The kernel driver's release ("535.309.01"); None with no driver (simulated)."""
        ...

    async def set_compute_mode(self, device: Device, *, exclusive: bool) -> None:
        """EXCLUSIVE_PROCESS while MPS runs on the device, DEFAULT otherwise."""
        ...

    async def processes(self, device: Device) -> list[GpuProcess]:
        """Compute and MPS client processes on the device with the memory each uses."""
        ...

    async def watch_events(self, emit: GpuEventSink) -> None:
        """Report Xid and other critical events until cancelled (a supervised task)."""
        ...


class TelemetrySource(Protocol):
    """Reads one sample of counters (canonical names) for each of the given devices."""

    name: str

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def read(self, devices: Sequence[Device]) -> list[Sample]: ...
