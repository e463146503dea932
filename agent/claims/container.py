"""What a claim's container gets for one share: the CDI device of the share (its lease's
MPS client environment, its mounts, its device's nodes by minor number, read from the
host's /dev now), with the NVIDIA toolkit's driver libraries and hooks where the node has
them. Built from the lease and the device the ledger holds, never from the claim's raw
JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.core.lease import Lease
from agent.core.types import Device
from agent.dra import devnodes
from agent.dra.cdi import SHM_PATH, CdiDevice, CdiDeviceNode, CdiEdits, CdiMount
from agent.node.service import NodeService

ShmOf = Callable[[str], str]  # device UUID -> host directory its MPS server uses as /dev/shm


class SharedMemory(Protocol):
    """The node's MPS daemons, as far as containers' /dev/shm goes (the MPS manager)."""

    def shm_dir(self, device_uuid: str) -> str:
        """The device's MPS servers' own directory; "" when they have none."""
        ...

    async def claim_shm(self, device_uuid: str, trust_domain: str, *, sole: bool = False) -> str:
        """The device's shared memory made ready for ``trust_domain`` (emptied, its servers
        shut down, when it served another); MpsError when it cannot be."""
        ...


@dataclass(frozen=True, slots=True)
class DriverPaths:
    cdi_dir: str
    shm_dir: str = ""  # mounted at /dev/shm in each client container when set
    shm_of: ShmOf | None = None  # per device (its MPS server's own); wins over shm_dir
    dev_root: str = "/dev"  # where the agent reads the host's device nodes (at each Prepare)
    proc_root: str = "/proc"  # where it reads the driver's MIG capability files
    host_dev: str = "/dev"  # the host's /dev as the container runtime sees it (hostPath)
    # True: a missing node fails the claim's Prepare (a real node); False where devices
    # have no nodes (a simulated node): what is missing is then left out.
    require_nodes: bool = False
    common: CdiEdits | None = None  # the NVIDIA toolkit's libraries and hooks, every claim

    def shm_for(self, device_uuid: str) -> str:
        """The host directory a client of ``device_uuid`` gets at /dev/shm ("" none)."""
        return self.shm_of(device_uuid) if self.shm_of is not None else self.shm_dir


def device_nodes(device: Device, paths: DriverPaths) -> list[CdiDeviceNode]:
    """The device's nodes as the host has them now (DeviceNodeError for one missing,
    where nodes are required)."""
    return devnodes.device_nodes(
        device,
        dev_root=paths.dev_root,
        proc_root=paths.proc_root,
        host_dev=paths.host_dev,
        required=paths.require_nodes,
    )


def share_device(node: NodeService, paths: DriverPaths, share_key: str, lease: Lease) -> CdiDevice:
    """The CDI device of one share (named by its key) admitted as ``lease``. It stats the
    device's nodes in /dev (and reads /proc for a MIG share): a few syscalls on local
    pseudo-filesystems, called on the event loop by the claim driver."""
    env, edits = node.container_edits(lease)
    # the pipe directory read-only: a client cannot plant or remove what the next relies on
    mounts = [CdiMount(host, container, read_only=True) for host, container in edits]
    shm_dir = paths.shm_for(lease.device_uuid)
    if shm_dir:
        mounts.append(CdiMount(shm_dir, SHM_PATH))
    device = node.devices[lease.device_uuid]
    nodes = device_nodes(device, paths)
    return CdiDevice(share_key, env, mounts, nodes, common=paths.common or None)


def admin_device(share_key: str, device: Device, paths: DriverPaths) -> CdiDevice:
    """The CDI device of an ``adminAccess`` request: the device itself (its nodes, its UUID
    in ``NVIDIA_VISIBLE_DEVICES``) and no share of it: no MPS client environment, no
    limits. The same few syscalls as :func:`share_device`."""
    env = {"NVIDIA_VISIBLE_DEVICES": device.uuid}
    return CdiDevice(share_key, env, (), device_nodes(device, paths), common=paths.common or None)
