"""The NVML adapter (``nvidia-ml-py``, module ``pynvml``): inventory, processes, compute mode
and critical events of a real node.

NVML is initialised once in ``start`` and every call runs in a worker thread. NVML errors
become :class:`GpuError` with the original chained; a missing library or driver becomes
:class:`GpuUnavailableError` with a message that says what is missing and how to run
without a GPU. A GPU in MIG mode is listed as its MIG instances, each a device of its own.
Each device carries its minor number (its /dev/nvidia<N>, which need not follow the index;
a MIG instance its parent's) and a MIG instance its GPU and compute instance ids.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pynvml

from agent.core.errors import GpuError, GpuUnavailableError
from agent.core.types import Device, GpuProcess, SharingMode
from agent.gpu.port import GpuEventSink

log = logging.getLogger(__name__)

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
EVENT_MASK = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeGpuUnavailableError
    | pynvml.nvmlEventTypeFatalPoisonError
    | pynvml.nvmlEventTypeGpuRecoveryAction
)
_EVENT_KINDS = {
    pynvml.nvmlEventTypeXidCriticalError: "gpu.xid",
    pynvml.nvmlEventTypeDoubleBitEccError: "gpu.ecc_double_bit",
    pynvml.nvmlEventTypeGpuUnavailableError: "gpu.unavailable",
    pynvml.nvmlEventTypeFatalPoisonError: "gpu.fatal_poison",
    pynvml.nvmlEventTypeGpuRecoveryAction: "gpu.recovery_action",
}


def translate(exc: pynvml.NVMLError, action: str) -> GpuError:
    """The agent's error for an NVML failure during ``action``."""
    for cls, hint in _UNAVAILABLE_HINTS.items():
        if isinstance(exc, cls):
            return GpuUnavailableError(f"cannot {action}: {hint}. {SIM_HINT}")
    return GpuError(f"cannot {action}: NVML error {exc.value}: {exc}")


def call(action: str, fn: Any, *args: Any) -> Any:
    """Run one NVML call, translating its errors."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise translate(exc, action) from exc


def optional(fn: Any, *args: Any) -> Any:
    """An NVML value the device may not support: None instead of NotSupported / NotFound."""
    try:
        return fn(*args)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_NotFound):
        return None


class NvmlGpuBackend:
    name = "nvml"

    def __init__(self) -> None:
        self._initialised = False

    async def start(self) -> None:
        await asyncio.to_thread(call, "initialise NVML", pynvml.nvmlInit)
        self._initialised = True

    async def aclose(self) -> None:
        if self._initialised:
            self._initialised = False
            await asyncio.to_thread(call, "shut NVML down", pynvml.nvmlShutdown)

    async def list_devices(self) -> list[Device]:
        return await asyncio.to_thread(self._list_devices)

    async def driver_version(self) -> str | None:
        version = await asyncio.to_thread(
            call, "read the driver version", pynvml.nvmlSystemGetDriverVersion
        )
        return version.decode() if isinstance(version, bytes) else str(version)

    def _list_devices(self) -> list[Device]:
        devices: list[Device] = []
        for index in range(call("count GPUs", pynvml.nvmlDeviceGetCount)):
            handle = call(f"open GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index)
            gpu = _device(handle, index)
            mode = optional(pynvml.nvmlDeviceGetMigMode, handle)
            if mode is not None and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
                devices.extend(_mig_devices(handle, gpu))
            else:
                devices.append(gpu)
        return devices

    async def set_compute_mode(self, device: Device, *, exclusive: bool) -> None:
        if device.is_mig:
            return  # compute mode belongs to the whole GPU; MIG instances follow their GPU
        await asyncio.to_thread(self._set_compute_mode, device.uuid, exclusive)

    @staticmethod
    def _set_compute_mode(uuid: str, exclusive: bool) -> None:
        handle = call(f"open GPU {uuid}", pynvml.nvmlDeviceGetHandleByUUID, uuid)
        mode = (
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
            if exclusive
            else pynvml.NVML_COMPUTEMODE_DEFAULT
        )
        call(f"set the compute mode of {uuid}", pynvml.nvmlDeviceSetComputeMode, handle, mode)

    async def processes(self, device: Device) -> list[GpuProcess]:
        return await asyncio.to_thread(_processes, device.uuid)

    async def watch_events(self, emit: GpuEventSink) -> None:
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def deliver(kind: str, message: str, uuid: str | None, attrs: dict[str, str]) -> None:
            loop.call_soon_threadsafe(emit, kind, message, uuid, attrs)

        watcher = asyncio.to_thread(_wait_for_events, deliver, stop)
        try:
            await watcher
        finally:
            stop.set()


def _device(handle: Any, index: int) -> Device:
    memory = call(f"read GPU {index} memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
    major, minor = call(
        f"read GPU {index} capability", pynvml.nvmlDeviceGetCudaComputeCapability, handle
    )
    return Device(
        uuid=call(f"read GPU {index} UUID", pynvml.nvmlDeviceGetUUID, handle),
        index=index,
        model=call(f"read GPU {index} name", pynvml.nvmlDeviceGetName, handle),
        memory_bytes=int(memory.total),
        sharing_mode=SharingMode.MPS,
        compute_capability=(int(major), int(minor)),
        minor=_minor_number(handle),
    )


def _minor_number(handle: Any) -> int | None:
    """The GPU's /dev/nvidia<N> (None where NVML has no device nodes to tell of)."""
    number = optional(pynvml.nvmlDeviceGetMinorNumber, handle)
    return None if number is None else int(number)


def _mig_devices(handle: Any, gpu: Device) -> list[Device]:
    devices = []
    for slot in range(call("count MIG slots", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)):
        mig = optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is None:
            continue
        name = call("read MIG name", pynvml.nvmlDeviceGetName, mig)
        devices.append(
            Device(
                uuid=call("read MIG UUID", pynvml.nvmlDeviceGetUUID, mig),
                index=gpu.index,
                model=gpu.model,
                memory_bytes=int(
                    call("read MIG memory", pynvml.nvmlDeviceGetMemoryInfo, mig).total
                ),
                sharing_mode=SharingMode.MPS,
                compute_capability=gpu.compute_capability,
                parent_uuid=gpu.uuid,
                mig_profile=name.rsplit("MIG ", 1)[-1] if "MIG " in name else name,
                gpu_instance_id=int(
                    call("read MIG instance", pynvml.nvmlDeviceGetGpuInstanceId, mig)
                ),
                minor=gpu.minor,
                compute_instance_id=int(
                    call("read MIG compute instance", pynvml.nvmlDeviceGetComputeInstanceId, mig)
                ),
            )
        )
    return devices


def _processes(uuid: str) -> list[GpuProcess]:
    handle = call(f"open {uuid}", pynvml.nvmlDeviceGetHandleByUUID, uuid)
    found: dict[int, GpuProcess] = {}
    for fn, mps in (
        (pynvml.nvmlDeviceGetComputeRunningProcesses, False),
        (pynvml.nvmlDeviceGetMPSComputeRunningProcesses, True),
    ):
        for p in optional(fn, handle) or []:
            memory = p.usedGpuMemory
            found[p.pid] = GpuProcess(int(p.pid), None if memory is None else int(memory), mps)
    return list(found.values())


def _wait_for_events(deliver: Any, stop: threading.Event) -> None:
    """Blocking NVML event loop for a worker thread; returns when ``stop`` is set."""
    event_set = call("create an NVML event set", pynvml.nvmlEventSetCreate)
    try:
        for index in range(call("count GPUs", pynvml.nvmlDeviceGetCount)):
            handle = call(f"open GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index)
            supported = optional(pynvml.nvmlDeviceGetSupportedEventTypes, handle) or 0
            if supported & EVENT_MASK:
                optional(pynvml.nvmlDeviceRegisterEvents, handle, supported & EVENT_MASK, event_set)
        while not stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait(event_set, 500)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                raise translate(exc, "wait for NVML events") from exc
            kind = _EVENT_KINDS.get(data.eventType, "gpu.event")
            uuid = optional(pynvml.nvmlDeviceGetUUID, data.device)
            deliver(
                kind,
                f"{kind} on {uuid}: data {data.eventData}",
                uuid,
                {"data": str(data.eventData), "event_type": str(data.eventType)},
            )
    finally:
        optional(pynvml.nvmlEventSetFree, event_set)
