"""What the device plugin asks of the agent: the ids it advertises, and what a container
that was given some of them gets (its environment, mounts, device nodes, CDI names)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_RESOURCE_NAME = "gpushare.io/share"


@dataclass(frozen=True)
class Mount:
    """A host path mounted into the container."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceNode:
    """A host device node made available in the container, with its cgroup permissions
    (one or more of ``r``, ``w``, ``m``)."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAllocation:
    """What the kubelet injects into one container for the ids allocated to it."""

    envs: Mapping[str, str]
    mounts: Sequence[Mount] = ()
    devices: Sequence[DeviceNode] = ()
    cdi_devices: Sequence[str] = ()  # fully qualified CDI names, e.g. nvidia.com/gpu=GPU-...
    annotations: Mapping[str, str] = field(default_factory=dict)


class AllocationRefused(Exception):
    """The allocator will not serve these ids; the message is shown to the kubelet (and so
    in the pod's events), which then fails the pod's admission or its container's start."""


class Allocator(Protocol):
    def device_ids(self) -> Sequence[str]:
        """The ids ListAndWatch advertises, all healthy."""
        ...

    async def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        """What one container given ``device_ids`` gets; may raise AllocationRefused."""
        ...

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """Called before the container given ``device_ids`` starts; may raise
        AllocationRefused."""
        ...
