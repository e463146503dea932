"""The device nodes a share's CDI device carries: its GPU's /dev/nvidia<minor> (by NVML's
minor number, not the index), a MIG instance's parent node and capability nodes, the
control nodes; read from the host's /dev at each Prepare, a missing one the claim's error.

The agent runs for real on fake GPUs; the host's /dev and /proc are trees in a temporary
directory, with real character device nodes (made with mknod: root only) and the driver's
capability files in their real format."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agent.claims.container import DriverPaths, share_device
from agent.core.types import Device
from agent.core.units import GIB
from agent.dra import devnodes
from agent.dra.cdi import CdiDeviceNode, claim_spec
from agent.dra.devnodes import DeviceNodeError, read_cap_minor
from agent.gpu.fake import FakeGpuBackend, fake_uuid
from tests.dra.inprocess import lease_on, node_of

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="character device nodes are made with mknod, which needs root"
)
CONTROL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000002"


def mknod(path: Path, minor: int = 3) -> None:
    """A character device node at ``path`` (major 1: the memory devices, harmless)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))


def capability(proc: Path, relative: str, minor: int) -> None:
    """A MIG capability access file as the driver writes it."""
    path = proc / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")


@pytest.fixture
def host(root: Path) -> tuple[Path, Path]:
    """The host's /dev (every GPU node 0-3 and the control nodes) and /proc."""
    dev, proc = root / "dev", root / "proc"
    for name in ["nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"]:
        mknod(dev / name)
    mknod(dev / "nvidia-uvm-tools")
    proc.mkdir()
    return dev, proc


def paths(root: Path, dev: Path, proc: Path, *, required: bool = True) -> DriverPaths:
    return DriverPaths(
        cdi_dir=str(root / "cdi"),
        dev_root=str(dev),
        proc_root=str(proc),
        require_nodes=required,
    )


def gpu(index: int, minor: int | None) -> Device:
    return Device(fake_uuid("GPU", "t", index), index, "H100", 80 * GIB, minor=minor)


def mig(parent: Device, gi: int, ci: int) -> Device:
    return Device(
        fake_uuid("MIG", parent.uuid, gi),
        parent.index,
        parent.model,
        40 * GIB,
        parent_uuid=parent.uuid,
        mig_profile="3g.40gb",
        gpu_instance_id=gi,
        minor=parent.minor,
        compute_instance_id=ci,
    )


@needs_root
async def test_a_gpu_share_gets_its_node_by_minor_number_not_its_index(
    root: Path, host: tuple[Path, Path]
) -> None:
    dev, proc = host
    backend = FakeGpuBackend.with_gpus(2, minors=[1, 0])  # the two orders differ
    first, second = await backend.list_devices()
    async with node_of(root, [first, second]) as node:
        device = share_device(node, paths(root, dev, proc), "s1", await lease_on(node, first))
        other = share_device(node, paths(root, dev, proc), "s2", await lease_on(node, second))
    assert [n.path for n in device.device_nodes] == ["/dev/nvidia1", *CONTROL]
    assert [n.path for n in other.device_nodes] == ["/dev/nvidia0", *CONTROL]
    assert all(n.host_path in ("", n.path) for n in device.device_nodes)
    spec = claim_spec(UID, [device])
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidia1",
        "permissions": "rw",
    }
    assert spec["devices"][0]["containerEdits"]["env"] == [
        f"{k}={v}" for k, v in sorted(device.env.items())
    ]
    assert device.env["NVIDIA_VISIBLE_DEVICES"] == first.uuid


@needs_root
async def test_a_mig_share_gets_its_parent_node_and_its_instances_capability_nodes(
    root: Path, host: tuple[Path, Path]
) -> None:
    dev, proc = host
    parent = gpu(1, minor=3)
    instance, neighbour = mig(parent, gi=2, ci=0), mig(parent, gi=1, ci=0)
    gi_access, ci_access = devnodes.mig_access_files(3, 2, 0)
    capability(proc, gi_access, 30)
    capability(proc, ci_access, 31)
    for relative, minor in zip(devnodes.mig_access_files(3, 1, 0), (21, 22), strict=True):
        capability(proc, relative, minor)  # the neighbour's: not this share's
    for minor in (21, 22, 30, 31):
        mknod(dev / "nvidia-caps" / f"nvidia-cap{minor}")
    async with node_of(root, [gpu(0, minor=0), instance, neighbour]) as node:
        device = share_device(node, paths(root, dev, proc), "s1", await lease_on(node, instance))
    assert [n.path for n in device.device_nodes] == [
        "/dev/nvidia3",
        "/dev/nvidia-caps/nvidia-cap30",
        "/dev/nvidia-caps/nvidia-cap31",
        *CONTROL,
    ]


@needs_root
async def test_a_missing_node_fails_the_claim_unless_the_node_is_simulated(
    root: Path, host: tuple[Path, Path]
) -> None:
    dev, proc = host
    (dev / "nvidia1").unlink()
    (dev / "nvidia-uvm-tools").unlink()  # profilers' only: no claim needs it
    device = gpu(0, minor=1)
    async with node_of(root, [device]) as node:
        lease = await lease_on(node, device)
        with pytest.raises(DeviceNodeError, match=f"needs /dev/nvidia1, but {dev}/nvidia1 does"):
            share_device(node, paths(root, dev, proc), "s1", lease)
        simulated = share_device(node, paths(root, dev, proc, required=False), "s1", lease)
        assert [n.path for n in simulated.device_nodes] == CONTROL[:2]
        (dev / "nvidia1").write_text("")  # a file, not a device
        with pytest.raises(DeviceNodeError, match="is not a character device"):
            share_device(node, paths(root, dev, proc), "s1", lease)


@needs_root
async def test_nodes_are_read_at_each_prepare_so_a_node_made_later_is_found(
    root: Path, host: tuple[Path, Path]
) -> None:
    """A MIG instance made after the agent started: its capability files and nodes appear
    then, and its share gets them; until they are there, Prepare says what is missing."""
    dev, proc = host
    instance = mig(gpu(0, minor=2), gi=5, ci=1)
    gi_access, ci_access = devnodes.mig_access_files(2, 5, 1)
    async with node_of(root, [instance]) as node:
        lease = await lease_on(node, instance)
        with pytest.raises(DeviceNodeError, match="gpu2/mig/gi5/access"):
            share_device(node, paths(root, dev, proc), "s1", lease)
        capability(proc, gi_access, 40)
        capability(proc, ci_access, 41)
        with pytest.raises(DeviceNodeError, match="nvidia-caps/nvidia-cap40 does not exist"):
            share_device(node, paths(root, dev, proc), "s1", lease)
        mknod(dev / "nvidia-caps" / "nvidia-cap40")
        mknod(dev / "nvidia-caps" / "nvidia-cap41")
        device = share_device(node, paths(root, dev, proc), "s1", lease)
    assert [n.path for n in device.device_nodes][:3] == [
        "/dev/nvidia2",
        "/dev/nvidia-caps/nvidia-cap40",
        "/dev/nvidia-caps/nvidia-cap41",
    ]


@needs_root
def test_a_device_whose_minor_is_not_known_gets_no_gpu_node(host: tuple[Path, Path]) -> None:
    dev, proc = host
    unknown = gpu(0, minor=None)
    with pytest.raises(DeviceNodeError, match=r"minor number .* is not known"):
        devnodes.device_nodes(unknown, dev_root=str(dev), proc_root=str(proc))
    nodes = devnodes.device_nodes(unknown, dev_root=str(dev), proc_root=str(proc), required=False)
    assert [n.path for n in nodes] == CONTROL


@needs_root
def test_the_spec_names_the_hosts_dev_wherever_the_agent_reads_it(
    host: tuple[Path, Path],
) -> None:
    """The agent reads the host's /dev through its own mount of it; the runtime, on the
    host, is given the host's paths."""
    dev, proc = host
    nodes = devnodes.device_nodes(gpu(0, minor=2), dev_root=str(dev), proc_root=str(proc))
    assert nodes[0] == CdiDeviceNode("/dev/nvidia2", "/dev/nvidia2")
    seen_elsewhere = devnodes.device_nodes(
        gpu(0, minor=2), dev_root=str(dev), proc_root=str(proc), host_dev=str(dev)
    )
    assert seen_elsewhere[0] == CdiDeviceNode("/dev/nvidia2", f"{dev}/nvidia2")


def test_capability_files_are_read_in_the_drivers_format(tmp_path: Path) -> None:
    capability(tmp_path, "driver/nvidia/capabilities/gpu0/mig/gi1/access", 12)
    assert read_cap_minor(str(tmp_path), "driver/nvidia/capabilities/gpu0/mig/gi1/access") == 12
    (tmp_path / "bad").write_text("DeviceFileMode: 292\n")
    with pytest.raises(DeviceNodeError, match="no DeviceFileMinor line"):
        read_cap_minor(str(tmp_path), "bad")
    with pytest.raises(DeviceNodeError, match="no MIG capability file"):
        read_cap_minor(str(tmp_path), "missing")
    assert devnodes.mig_access_files(3, 2, 0) == (
        "driver/nvidia/capabilities/gpu3/mig/gi2/access",
        "driver/nvidia/capabilities/gpu3/mig/gi2/ci0/access",
    )
