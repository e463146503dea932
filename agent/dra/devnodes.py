"""The device nodes a container needs for one GPU or MIG instance, read from the host's /dev
at each Prepare (never from a copy taken at the agent's start: a node the host creates
later, a MIG instance's capability node for one, is found when a claim needs it).

- A whole GPU: ``/dev/nvidia<minor>``, by NVML's minor number, which need not follow the
  NVML index.
- A MIG instance: its parent GPU's ``/dev/nvidia<minor>`` and the capability nodes of its
  GPU instance and compute instance, ``/dev/nvidia-caps/nvidia-cap<N>``, each N read from
  the driver's ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access`` and
  ``.../gi<G>/ci<C>/access`` (a line ``DeviceFileMinor: N``).
- Every device: the control nodes ``/dev/nvidiactl`` and ``/dev/nvidia-uvm`` (and
  ``/dev/nvidia-uvm-tools`` where the host has it: profilers use it, CUDA does not).

``dev_root`` is where the agent sees the host's /dev (a hostPath mount in its pod) and
``proc_root`` the host's /proc; ``host_dev`` is the host's /dev as the container runtime
sees it, the ``hostPath`` the spec names. A node that is missing, or is not a character
device, is a :class:`DeviceNodeError` for the claim, unless ``required`` is off (a
simulated node, whose devices have no nodes): then it is left out.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat

from agent.core.errors import GpuError
from agent.core.types import Device
from agent.dra.cdi import CdiDeviceNode

CONTAINER_DEV = "/dev"
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
OPTIONAL_NODES = frozenset({"nvidia-uvm-tools"})
CAPS_DIR = "nvidia-caps"
CAPABILITIES = "driver/nvidia/capabilities"  # under /proc
_DEVICE_FILE_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


class DeviceNodeError(GpuError):
    """A device node a container needs is not on the host (or its number is not known)."""


def gpu_node(minor: int) -> str:
    """The GPU's node, relative to /dev."""
    return f"nvidia{minor}"


def cap_node(cap_minor: int) -> str:
    """A capability node, relative to /dev."""
    return f"{CAPS_DIR}/nvidia-cap{cap_minor}"


def mig_access_files(gpu_minor: int, gi: int, ci: int) -> tuple[str, str]:
    """The access files of a GPU instance and its compute instance, relative to /proc."""
    gi_dir = f"{CAPABILITIES}/gpu{gpu_minor}/mig/gi{gi}"
    return f"{gi_dir}/access", f"{gi_dir}/ci{ci}/access"


def read_cap_minor(proc_root: str, relative: str) -> int:
    """The ``DeviceFileMinor`` of a capability's access file under ``proc_root``."""
    path = posixpath.join(proc_root, relative)
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        raise DeviceNodeError(
            f"no MIG capability file {path}: the instance is gone, or the driver does not "
            "expose /proc/driver/nvidia here"
        ) from None
    except OSError as exc:
        raise DeviceNodeError(f"cannot read MIG capability file {path}: {exc}") from exc
    found = _DEVICE_FILE_MINOR.search(text)
    if found is None:
        raise DeviceNodeError(f"MIG capability file {path} has no DeviceFileMinor line")
    return int(found[1])


def node_names(device: Device, *, proc_root: str = "/proc", required: bool = True) -> list[str]:
    """The device's own nodes, relative to /dev (the GPU's, a MIG instance's capabilities).
    Raises :class:`DeviceNodeError` for what is not known, unless not ``required``."""
    if device.minor is None:
        if required:
            raise DeviceNodeError(
                f"the minor number of device {device.uuid} is not known: its /dev/nvidia<N> "
                "cannot be given to a container"
            )
        return []
    names = [gpu_node(device.minor)]
    if not device.is_mig:
        return names
    gi, ci = device.gpu_instance_id, device.compute_instance_id
    if gi is None or ci is None:
        if required:
            raise DeviceNodeError(
                f"MIG device {device.uuid} has no GPU or compute instance id: its capability "
                "nodes cannot be found"
            )
        return names
    for access in mig_access_files(device.minor, gi, ci):
        try:
            names.append(cap_node(read_cap_minor(proc_root, access)))
        except DeviceNodeError:
            if required:
                raise
    return names


def device_nodes(
    device: Device,
    *,
    dev_root: str = "/dev",
    proc_root: str = "/proc",
    host_dev: str = "/dev",
    required: bool = True,
) -> list[CdiDeviceNode]:
    """The CDI device nodes of ``device``: its own, then the control nodes, each checked to
    be a character device under ``dev_root`` now."""
    names = node_names(device, proc_root=proc_root, required=required) + list(CONTROL_NODES)
    nodes = []
    for name in names:
        problem = _not_a_node(posixpath.join(dev_root, name))
        if problem:
            if required and name not in OPTIONAL_NODES:
                raise DeviceNodeError(f"device {device.uuid} needs /dev/{name}, but {problem}")
            continue
        container = posixpath.join(CONTAINER_DEV, name)
        nodes.append(CdiDeviceNode(container, host_path=posixpath.join(host_dev, name)))
    return nodes


def _not_a_node(path: str) -> str:
    """Why ``path`` is not a character device ("" when it is one)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be read: {exc}"
    return "" if stat.S_ISCHR(mode) else f"{path} is not a character device"
