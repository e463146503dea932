"""A whole GPU's compute mode as NVML reads it (``nvmlDeviceGetComputeMode``). NVML must
already be initialised by :class:`~agent.gpu.nvml.NvmlGpuBackend`; the call runs in a
worker thread and its errors are the backend's (:func:`~agent.gpu.nvml.translate`)."""

from __future__ import annotations

import asyncio

import pynvml

from agent.core.errors import GpuError
from agent.core.types import Device
from agent.gpu.compute_mode import ComputeMode
from agent.gpu.nvml import call

NVML_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: ComputeMode.DEFAULT,
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: ComputeMode.EXCLUSIVE_THREAD,
    pynvml.NVML_COMPUTEMODE_PROHIBITED: ComputeMode.PROHIBITED,
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: ComputeMode.EXCLUSIVE_PROCESS,
}


class NvmlComputeModes:
    async def read(self, device: Device) -> ComputeMode:
        return await asyncio.to_thread(_read, device.uuid)


def _read(uuid: str) -> ComputeMode:
    handle = call(f"open GPU {uuid}", pynvml.nvmlDeviceGetHandleByUUID, uuid)
    value = call(f"read the compute mode of {uuid}", pynvml.nvmlDeviceGetComputeMode, handle)
    try:
        return NVML_MODES[value]
    except KeyError:
        raise GpuError(
            f"GPU {uuid} reports compute mode {value}, which NVML does not name"
        ) from None
