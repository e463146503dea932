"""An allocator for the device-plugin tests: it answers what it is told and records what
it was asked."""

from __future__ import annotations

from collections.abc import Sequence

from agent.legacy.deviceplugin.kubelet.port import (
    AllocationRefused,
    ContainerAllocation,
    DeviceNode,
    Mount,
)

ANSWER = ContainerAllocation(
    envs={"CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps", "GPUSHARE_LEASE": "lease-1"},
    mounts=(
        Mount("/run/gpushare/mps", "/var/run/gpushare/mps/0", read_only=True),
        Mount("/dev/shm", "/var/lib/gpushare/shm"),
    ),
    devices=(
        DeviceNode("/dev/nvidia0", "/dev/nvidia0"),
        DeviceNode("/dev/nvidiactl", "/dev/nvidiactl", "rwm"),
    ),
    cdi_devices=("nvidia.com/gpu=GPU-0a1b",),
    annotations={"gpushare.io/lease": "lease-1"},
)


class RecordingAllocator:
    def __init__(self, ids: Sequence[str], answer: ContainerAllocation = ANSWER) -> None:
        self.ids = list(ids)
        self.answer = answer
        self.refuse_allocate: str | None = None
        self.refuse_pre_start: str | None = None
        self.fail_allocate: Exception | None = None
        self.allocated: list[list[str]] = []
        self.pre_started: list[list[str]] = []

    def device_ids(self) -> Sequence[str]:
        return list(self.ids)

    async def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        self.allocated.append(list(device_ids))
        if self.fail_allocate is not None:
            raise self.fail_allocate
        if self.refuse_allocate is not None:
            raise AllocationRefused(self.refuse_allocate)
        return self.answer

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        self.pre_started.append(list(device_ids))
        if self.refuse_pre_start is not None:
            raise AllocationRefused(self.refuse_pre_start)
