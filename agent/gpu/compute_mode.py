"""Putting a node's GPUs back to the compute mode DEFAULT (``gpushare gpu reset-compute-mode``,
the uninstall's reset): each whole GPU that is in EXCLUSIVE_PROCESS, the mode the agent sets
while MPS serves it, is set to DEFAULT through the agent's own port
(:meth:`~agent.gpu.port.GpuBackend.set_compute_mode`, as the agent's stop does) and read
back. A GPU in another mode is left as it is: DEFAULT needs nothing, and PROHIBITED or
EXCLUSIVE_THREAD were not set by the agent. A MIG GPU is left too: compute mode belongs to
the whole GPU, which the agent never changes while MIG is on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from agent.core.errors import GpuError
from agent.core.types import Device
from agent.gpu.port import GpuBackend


class ComputeMode(StrEnum):
    """NVML's compute modes, by the names nvidia-smi prints (values 0 to 3 in NVML)."""

    DEFAULT = "DEFAULT"
    EXCLUSIVE_THREAD = "EXCLUSIVE_THREAD"
    PROHIBITED = "PROHIBITED"
    EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"


class ComputeModeReader(Protocol):
    """Reads a whole GPU's compute mode (the driver's, which outlives every process)."""

    async def read(self, device: Device) -> ComputeMode: ...


@dataclass(frozen=True)
class GpuReset:
    """What was done to one GPU: its mode before and after, or why it failed."""

    index: int
    uuid: str
    before: ComputeMode | None
    after: ComputeMode | None
    error: str = ""
    note: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.error)

    def line(self) -> str:
        where = f"GPU {self.index} {self.uuid}"
        if self.error:
            return f"{where}: {self.error}"
        if self.before is ComputeMode.EXCLUSIVE_PROCESS:
            return f"{where}: EXCLUSIVE_PROCESS -> {self.after} (read back)"
        return f"{where}: {self.note or f'{self.before}, left as it is'}"


def whole_gpus(devices: Sequence[Device]) -> tuple[list[Device], list[Device]]:
    """(whole GPUs, one MIG instance per MIG GPU), in index order."""
    whole = [d for d in devices if not d.is_mig]
    migs: dict[str, Device] = {}
    for device in devices:
        if device.parent_uuid is not None:
            migs.setdefault(device.parent_uuid, device)
    return sorted(whole, key=lambda d: d.index), sorted(migs.values(), key=lambda d: d.index)


async def reset_exclusive(backend: GpuBackend, reader: ComputeModeReader) -> list[GpuReset]:
    """Every whole GPU in EXCLUSIVE_PROCESS set to DEFAULT and read back; one result per
    GPU. A GPU that refuses does not stop the others."""
    whole, migs = whole_gpus(await backend.list_devices())
    results = [await _reset_one(backend, reader, device) for device in whole]
    for mig in migs:
        note = "MIG enabled: compute mode left as it is (the agent never changes it)"
        results.append(GpuReset(mig.index, mig.parent_uuid or mig.uuid, None, None, note=note))
    return sorted(results, key=lambda r: r.index)


async def _reset_one(backend: GpuBackend, reader: ComputeModeReader, device: Device) -> GpuReset:
    try:
        before = await reader.read(device)
    except GpuError as exc:
        return GpuReset(device.index, device.uuid, None, None, error=str(exc))
    if before is not ComputeMode.EXCLUSIVE_PROCESS:
        return GpuReset(device.index, device.uuid, before, before)
    try:
        await backend.set_compute_mode(device, exclusive=False)
        after = await reader.read(device)
    except GpuError as exc:
        return GpuReset(device.index, device.uuid, before, None, error=str(exc))
    if after is not ComputeMode.DEFAULT:
        error = f"set to DEFAULT, but it reads {after}"
        return GpuReset(device.index, device.uuid, before, after, error=error)
    return GpuReset(device.index, device.uuid, before, after)
