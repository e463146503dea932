"""A claim's CDI spec, as the agent writes it, through a real container runtime: podman
(with runc) runs a container given the claim's devices (``--device
gpushare.io/claim=<name>``) and the test looks from inside it.

- device nodes: the GPU's /dev/nvidia<minor> (not /dev/nvidia<index>), a MIG instance's
  parent node and capability nodes, the control nodes; stand-in character devices made
  with mknod in a temporary host /dev (the MIG capability files in a temporary /proc);
- mounts: /dev/shm and the driver's libraries carry nosuid,nodev (/dev/shm noexec), as
  /proc/self/mountinfo shows, so that nothing one claim's container leaves in a directory
  both get runs in the other as setuid, as a device, or at all;
- the NVIDIA toolkit's hooks (a stand-in nvidia-ctk, a stand-in nvidia-cdi-hook that
  records its calls): the runtime runs each createContainer hook once, with its arguments.

Podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi (it has no cdi_spec_dirs
setting or --cdi-spec-dir flag yet), so each container runs in a mount namespace of its own
(``unshare --mount``) in which the test's spec directory is bound over /run/cdi: nothing of
the host's CDI directory is read or written (/run/cdi is made, empty, where it is missing).
The container's root is a busybox (Debian's busybox-static) directory. Skips, saying why,
without root, podman, unshare or busybox-static.
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from agent.claims.container import DriverPaths, share_device
from agent.core.types import Device
from agent.core.units import GIB
from agent.dra import devnodes, toolkit
from agent.dra.cdi import CDI_KIND, CdiDevice, cdi_name, claim_spec, write_spec
from agent.gpu.fake import fake_uuid
from tests.dra.inprocess import lease_on, node_of
from tests.dra.toolkit_standin import DRIVER, LIB_DIR, hook_calls, make_standin
from tests.helpers import REPO

pytestmark = pytest.mark.timeout(300)

CONTAINERS_CONF = REPO / "deploy" / "image" / "containers.conf"  # default_ulimits = []
CDI_DIR_READ = Path("/run/cdi")  # /var/run/cdi: the later of podman's two spec directories
UID = "7a1e2d3c-aaaa-bbbb-cccc-000000000004"
# (name under /dev, major, minor): memory devices, harmless; distinct numbers to tell apart
NODES = [
    ("nvidia0", 1, 3),  # the first GPU's index: must not be given
    ("nvidia1", 1, 3),  # the second GPU's index: must not be given
    ("nvidia2", 1, 7),  # the first GPU's minor number
    ("nvidia3", 1, 8),  # the second GPU's (in MIG mode): its instance's parent
    ("nvidiactl", 1, 5),
    ("nvidia-uvm", 1, 3),
    ("nvidia-uvm-tools", 1, 9),
    ("nvidia-caps/nvidia-cap12", 1, 3),  # the instance's GPU instance
    ("nvidia-caps/nvidia-cap13", 1, 5),  # its compute instance
    ("nvidia-caps/nvidia-cap21", 1, 3),  # another instance's: must not be given
]


def podman_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mknod, unshare --mount, rootful podman)"
    for program in ("podman", "unshare", "dpkg-deb"):
        if shutil.which(program) is None:
            return f"{program} is not installed"
    probe = run(["podman", "info"], timeout=60)
    if probe.returncode != 0:
        return f"podman does not run here: {probe.stderr.strip()[-300:]}"
    return None


def run(
    argv: Sequence[str], timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
    return subprocess.run(
        list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A container root holding Debian's static busybox (from apt's cache, or fetched with
    apt-get download)."""
    if reason := podman_reason():
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("busybox")
    debs = sorted(glob.glob("/var/cache/apt/archives/busybox-static_*.deb"))
    if not debs:
        if shutil.which("apt-get") is None:
            pytest.skip("busybox-static is not in apt's cache, and there is no apt-get")
        fetched = run(["apt-get", "download", "busybox-static"], timeout=120, cwd=work)
        debs = sorted(str(p) for p in work.glob("busybox-static_*.deb"))
        if fetched.returncode != 0 or not debs:
            pytest.skip(f"busybox-static not in apt's cache nor fetched: {fetched.stderr[-300:]}")
    unpacked = work / "deb"
    done = run(["dpkg-deb", "-x", debs[0], str(unpacked)])
    if done.returncode != 0:
        pytest.skip(f"cannot unpack {debs[0]}: {done.stderr[-300:]}")
    root = work / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(unpacked / "bin" / "busybox", root / "bin" / "busybox")
    return root


def host_tree(root: Path) -> tuple[Path, Path]:
    dev, proc = root / "dev", root / "proc"
    for name, major, minor in NODES:
        (dev / name).parent.mkdir(parents=True, exist_ok=True)
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    for (gi, ci), (gi_minor, ci_minor) in {(1, 0): (12, 13), (2, 0): (21, 22)}.items():
        for relative, number in zip(
            devnodes.mig_access_files(3, gi, ci), (gi_minor, ci_minor), strict=True
        ):
            path = proc / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                f"DeviceFileMinor: {number}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
            )
    return dev, proc


def devices() -> tuple[Device, Device]:
    """GPU 0 (minor 2), and an instance (GPU instance 1, compute instance 0) of GPU 1
    (minor 3, MIG mode)."""
    gpu = Device(fake_uuid("GPU", "p", 0), 0, "H100", 80 * GIB, minor=2)
    parent = fake_uuid("GPU", "p", 1)
    instance = Device(
        fake_uuid("MIG", parent, 1),
        1,
        "H100",
        40 * GIB,
        parent_uuid=parent,
        mig_profile="3g.40gb",
        gpu_instance_id=1,
        minor=3,
        compute_instance_id=0,
    )
    return gpu, instance


def write_claim(paths: DriverPaths, shares: Sequence[CdiDevice]) -> list[str]:
    """Write the claim's spec; make the host directories its mounts name that the fake MPS
    does not (a real MPS server's pipe and log directories). Its CDI device names."""
    for share in shares:
        for mount in share.mounts:
            Path(mount.host_path).mkdir(parents=True, exist_ok=True)
    write_spec(paths.cdi_dir, UID, claim_spec(UID, shares))
    return [cdi_name(UID, share.device_name) for share in shares]


def in_container(
    rootfs: Path, cdi_dir: Path, names: Sequence[str], script: str, *extra: str
) -> str:
    """Run ``script`` (busybox sh) in a container given the claim's CDI devices ``names``."""
    CDI_DIR_READ.mkdir(parents=True, exist_ok=True)
    given = [f"--device={CDI_KIND}={name}" for name in names]
    podman = ["podman", "run", "--rm", "--network=none", *extra, *given]
    podman += ["--rootfs", str(rootfs), "/bin/busybox", "sh", "-c", script]
    inner = f'mount --bind "$1" {CDI_DIR_READ} && shift && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner, "sh"]
    done = run([*argv, str(cdi_dir), *podman], timeout=180)
    # podman's conmon outlives it a moment; the agent that ran in this process made it a
    # subreaper, so conmon is this process's child then: wait for it
    psutil.wait_procs([c for c in psutil.Process().children() if c.name() == "conmon"], 30)
    assert done.returncode == 0, f"podman failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout


def mount_options(mountinfo: str) -> dict[str, set[str]]:
    """Mount point -> its per-mount options, from /proc/self/mountinfo."""
    return {
        fields[4]: set(fields[5].split(","))
        for fields in (line.split() for line in mountinfo.splitlines())
        if len(fields) > 5
    }


def listed_nodes(listing: str) -> dict[str, tuple[int, int]]:
    """``ls -lnd`` of device files -> path: (major, minor)."""
    found = {}
    for line in listing.splitlines():
        fields = line.replace(",", " ").split()
        if fields and fields[0].startswith("c"):
            found[fields[-1]] = (int(fields[4]), int(fields[5]))
    return found


async def test_a_claims_container_gets_its_nodes_by_minor_hardened_mounts_and_the_hooks(
    root: Path, rootfs: Path
) -> None:
    dev, proc = host_tree(root)
    shm = root / "shm"
    shm.mkdir()
    standin = make_standin(root / "toolkit")
    found = await toolkit.load(str(standin.nvidia_ctk))
    assert found.edits is not None, found.why
    paths = DriverPaths(
        cdi_dir=str(root / "cdi"),
        shm_dir=str(shm),
        dev_root=str(dev),
        proc_root=str(proc),
        host_dev=str(dev),  # the runtime is on this host: the stand-in nodes are its nodes
        require_nodes=True,
        common=found.edits,
    )
    gpu, instance = devices()
    async with node_of(root, [gpu, instance]) as node:
        shares = [
            share_device(node, paths, key, await lease_on(node, device))
            for key, device in (("s0", gpu), ("s1", instance))
        ]
    names = write_claim(paths, shares)
    out = await asyncio.to_thread(
        in_container,
        rootfs,
        root / "cdi",
        names,
        "echo '== mounts'; cat /proc/self/mountinfo;"
        " echo '== nodes'; ls -lnd /dev/nvidia* /dev/nvidia-caps/*;"
        " echo '== env'; env",
    )
    mountinfo, rest = out.split("== mounts\n", 1)[1].split("== nodes\n", 1)
    listing, env = rest.split("== env\n", 1)

    nodes = listed_nodes(listing)
    assert sorted(nodes) == [
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia2",
        "/dev/nvidia3",
        "/dev/nvidiactl",
    ], listing
    assert (nodes["/dev/nvidia2"], nodes["/dev/nvidia3"]) == ((1, 7), (1, 8))

    options = mount_options(mountinfo)
    assert {"rw", "nosuid", "nodev", "noexec"} <= options["/dev/shm"], mountinfo
    library = f"{LIB_DIR}/libcuda.so.{DRIVER}"
    assert {"ro", "nosuid", "nodev"} <= options[library], mountinfo

    assert f"NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}" in env.splitlines()
    assert f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}" in env.splitlines() or (
        f"NVIDIA_VISIBLE_DEVICES={instance.uuid}" in env.splitlines()
    )

    calls = hook_calls(standin)
    assert calls == [
        ["create-symlinks", "--link", f"libcuda.so.1::{LIB_DIR}/libcuda.so"],
        ["enable-cuda-compat", f"--host-driver-version={DRIVER}"],
        ["update-ldcache", "--folder", LIB_DIR],
        ["disable-device-node-modification"],
    ], "each createContainer hook once (the claim's two devices share them)"
    states = standin.states.read_text().splitlines()
    assert all('"status":"creating"' in s.replace(" ", "") for s in states), states


async def test_what_one_claims_container_leaves_in_dev_shm_does_not_run_in_anothers(
    root: Path, rootfs: Path
) -> None:
    """Two claims' containers given the same host directory at /dev/shm: a program one
    leaves there (setuid root) does not run in the other (noexec; nosuid besides)."""
    dev, proc = host_tree(root)
    shm = root / "shm"
    shm.mkdir()
    paths = DriverPaths(
        cdi_dir=str(root / "cdi"),
        shm_dir=str(shm),
        dev_root=str(dev),
        proc_root=str(proc),
        host_dev=str(dev),
        require_nodes=True,
    )
    gpu, _ = devices()
    async with node_of(root, [gpu]) as node:
        first = share_device(node, paths, "s0", await lease_on(node, gpu))
    names = write_claim(paths, [first])
    plant = "cp /bin/busybox /dev/shm/busybox && chmod 4755 /dev/shm/busybox"
    await asyncio.to_thread(in_container, rootfs, root / "cdi", names, plant)
    assert (shm / "busybox").stat().st_mode & stat.S_ISUID, "planted, setuid root"
    run_it = "/dev/shm/busybox id 2>&1; echo exit=$?"
    out = await asyncio.to_thread(
        in_container, rootfs, root / "cdi", names, run_it, "--user=1000:1000"
    )
    assert "Permission denied" in out and "exit=126" in out, out
