"""The NVML adapter (``nvidia-ml-py``, module ``pynvml``): the real node's device inventory.

Every NVML call runs in a worker thread; NVML errors become :class:`GpuError` with the
original chained. A missing library or driver becomes :class:`GpuUnavailableError` with a
message that says what is missing and how to run without a GPU.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pynvml

from agent.core.errors import GpuError, GpuUnavailableError
from agent.core.types import Device, SharingMode

_UNAVAILABLE_HINTS: dict[type[Exception], str] = {
    pynvml.NVMLError_LibraryNotFound: (
        "the NVIDIA management library (libnvidia-ml.so.1) was not found: no NVIDIA driver "
        "is installed here, or the container was started without the NVIDIA runtime"
    ),
    pynvml.NVMLError_DriverNotLoaded: (
        "libnvidia-ml is present but the NVIDIA kernel driver is not loaded"
    ),
    pynvml.NVMLError_LibRmVersionMismatch: (
        "the NVML library and the kernel driver have different versions (a driver upgrade "
        "without a reboot?)"
    ),
}
SIM_HINT = "To run without a GPU, start the simulated node: gpushare serve --sim"


def translate(exc: pynvml.NVMLError, action: str) -> GpuError:
    """The agent's error for an NVML failure during ``action``."""
    for cls, hint in _UNAVAILABLE_HINTS.items():
        if isinstance(exc, cls):
            return GpuUnavailableError(f"cannot {action}: {hint}. {SIM_HINT}")
    return GpuError(f"cannot {action}: NVML error {exc.value}: {exc}")


class NvmlGpuBackend:
    name = "nvml"

    def __init__(self) -> None:
        self._initialised = False

    async def start(self) -> None:
        await asyncio.to_thread(self._call, "initialise NVML", pynvml.nvmlInit)
        self._initialised = True

    async def aclose(self) -> None:
        if self._initialised:
            self._initialised = False
            await asyncio.to_thread(self._call, "shut NVML down", pynvml.nvmlShutdown)

    async def list_devices(self) -> list[Device]:
        return await asyncio.to_thread(self._list_devices)

    async def set_compute_mode(self, device: Device, *, exclusive: bool) -> None:
        if device.is_mig:
            return  # compute mode belongs to the whole GPU; MIG instances follow their GPU
        await asyncio.to_thread(self._set_compute_mode, device.uuid, exclusive)

    def _set_compute_mode(self, uuid: str, exclusive: bool) -> None:
        handle = self._call(f"open GPU {uuid}", pynvml.nvmlDeviceGetHandleByUUID, uuid)
        mode = (
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
            if exclusive
            else pynvml.NVML_COMPUTEMODE_DEFAULT
        )
        self._call(f"set the compute mode of {uuid}", pynvml.nvmlDeviceSetComputeMode, handle, mode)

    def _list_devices(self) -> list[Device]:
        count = self._call("count GPUs", pynvml.nvmlDeviceGetCount)
        return [self._device(index) for index in range(count)]

    def _device(self, index: int) -> Device:
        handle = self._call(f"open GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index)
        memory = self._call(f"read GPU {index} memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
        major, minor = self._call(
            f"read GPU {index} capability", pynvml.nvmlDeviceGetCudaComputeCapability, handle
        )
        return Device(
            uuid=self._call(f"read GPU {index} UUID", pynvml.nvmlDeviceGetUUID, handle),
            index=index,
            model=self._call(f"read GPU {index} name", pynvml.nvmlDeviceGetName, handle),
            memory_bytes=int(memory.total),
            sharing_mode=SharingMode.MPS,
            compute_capability=(int(major), int(minor)),
        )

    @staticmethod
    def _call(action: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            raise translate(exc, action) from exc
