"""The MPS shared memory that `gpushare mps host` sets up, run in the image the way the
chart runs it (templates/agent/mps-host.yaml, rendered with shm.size set).

The podman run is derived from the rendered DaemonSet (tests/image/chartpod.py): its
arguments, privileged root with a read-only root filesystem, the host PID namespace, the
rendered config file, the run volume on a node directory that is a shared mount (as a node's
/run is; Bidirectional -> rshared), the memory emptyDir and the shm hostPath. Added only what
a machine without a GPU needs: --sim, the fake MPS control binary, and mps.root_dir where a
node keeps it (under the run volume; --sim would move it into the container). Then the
effect is checked from the host: a bounded tmpfs per device with the modes the clients
need, each daemon's /dev/shm its own device's, a non-root client bound to one device's
directory, the sticky bit, and nothing left mounted after SIGTERM.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.mps import shm
from tests.helpers import REPO
from tests.image.chartpod import PodRun, documents, find, podman_run
from tests.image.engine import BUILD_TIMEOUT_S, run

pytestmark = [pytest.mark.image, pytest.mark.timeout(BUILD_TIMEOUT_S + 120)]

SHM_SIZE = "64MiB"
SHM_SIZE_BYTES = 64 * 1024**2
KUBE_VERSION = "v1.30.14"
CLIENT, OTHER = "3000:2000", "3001:2000"  # two tenants' users, in the MPS client group
# What a machine without a GPU needs on top of the chart's arguments.
SIM_ARGS = [
    "--sim",
    "--set",
    "mps.control_binary=/opt/gpushare/bin/gpushare-fake-mps-control",
    "--set",
    "mps.root_dir=/run/gpushare/mps",
]
READY_TIMEOUT_S = 30.0


def load_render_module() -> Any:
    path = REPO / "deploy" / "helm" / "render.py"
    spec = importlib.util.spec_from_file_location("gpushare_render_shm", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class MpsHost:
    """The running mps-host container and what the chart set up for it."""

    name: str
    pod: PodRun
    config: dict[str, Any]

    @property
    def shm_root(self) -> Path:
        return self.pod.host_path(self.config["mps"]["shm_root"])

    @property
    def mps_root(self) -> Path:
        return self.pod.host_path("/run/gpushare/mps")

    def records(self) -> dict[str, dict[str, Any]]:
        """{device UUID: its daemon's shm.json}, as the host wrote them."""
        found = {}
        for path in self.mps_root.glob("*/shm.json"):
            with contextlib.suppress(OSError, ValueError):
                found[path.parent.name] = json.loads(path.read_text())
        return found

    def logs(self) -> str:
        result = run("logs", self.name)
        return (result.stdout + result.stderr)[-3000:]


def mounts_under(root: Path) -> dict[str, shm.MountEntry]:
    """The mounts this machine has below ``root``: {mount point: entry}."""
    prefix = f"{root}/"
    return {
        e.point: e for e in shm.parse_mountinfo(shm.read_mountinfo()) if e.point.startswith(prefix)
    }


@pytest.fixture(scope="module")
def node_root() -> Iterator[Path]:
    """A stand-in for the node's ``/``: a shared mount, as a node's /run is (kubelet's
    Bidirectional propagation needs it). Unmounted, with all below it, at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts a shared bind mount and runs privileged containers")
    root = Path(tempfile.mkdtemp(prefix="gs-node-", dir="/var/tmp"))
    for command in (
        ["mount", "--bind", str(root), str(root)],
        ["mount", "--make-rshared", str(root)],
    ):
        made = subprocess.run(command, capture_output=True, text=True, check=False)
        if made.returncode != 0:
            subprocess.run(["umount", "-R", root], capture_output=True, check=False)
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip(f"{' '.join(command)} failed: {made.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-R", root], capture_output=True, check=False)
        if mounts_under(root) or shm.mount_of(str(root), shm.read_mountinfo()):
            subprocess.run(["umount", "-R", "-l", root], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def mps_host(image: str, node_root: Path) -> Iterator[MpsHost]:
    """The chart's mps-host container, rendered with shm.size, running until its devices'
    shared memory is mounted; removed at the end whatever happened."""
    rendered = load_render_module().render({"shm": {"size": SHM_SIZE}}, kube_version=KUBE_VERSION)
    docs = documents(rendered)
    daemonset = find(docs, "DaemonSet", "gpushare-mps-host")
    pod = podman_run(docs, daemonset, "mps-host", node_root)
    config_map = next(
        v["configMap"]["name"]
        for v in daemonset["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    )
    config = yaml.safe_load(find(docs, "ConfigMap", config_map)["data"]["config.yaml"])
    host = MpsHost(f"gpushare-mps-host-{os.getpid()}", pod, config)
    started = run("run", "-d", "--name", host.name, *pod.options, image, *pod.args, *SIM_ARGS)
    assert started.returncode == 0, started.stderr
    try:
        wait_for_memory(host)
        yield host
    finally:
        run("rm", "-f", "-t", "0", host.name)


def wait_for_memory(host: MpsHost) -> None:
    """Until the devices with a daemon record are those with a tmpfs mounted, the same in
    two looks 0.5 s apart (a device's tmpfs is mounted before its record is written)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last: set[str] = set()
    while time.monotonic() < deadline:
        records = {str(host.shm_root / uuid) for uuid in host.records()}
        settled = records == set(mounts_under(host.shm_root)) and records == last
        if records and settled:
            return
        last = records
        time.sleep(0.5)
    raise AssertionError(
        f"no tmpfs per device under {host.shm_root} within {READY_TIMEOUT_S:g} s; "
        f"records {sorted(host.records())}, mounts {sorted(mounts_under(host.shm_root))}\n"
        f"{host.logs()}"
    )


def in_image(
    image: str, user: str, device_dir: Path, script: str
) -> subprocess.CompletedProcess[str]:
    """``script`` in a client container of ``user`` that has ``device_dir`` at /dev/shm, as
    the agent names it to a container (a bind mount)."""
    return run(
        "run", "--rm", "--network=none", "--read-only", "--user", user,
        "-v", f"{device_dir}:/dev/shm", "--entrypoint", "/bin/sh", image, "-c", script,
    )  # fmt: skip


def test_each_device_has_a_tmpfs_of_the_set_size_and_modes(mps_host: MpsHost) -> None:
    devices = sorted(mps_host.records())
    assert len(devices) >= 2, f"the simulated node has {len(devices)} device(s)"
    mounted = mounts_under(mps_host.shm_root)
    assert sorted(mounted) == [str(mps_host.shm_root / uuid) for uuid in devices]
    filesystems = set()
    for uuid in devices:
        entry = mounted[str(mps_host.shm_root / uuid)]
        assert entry.fstype == "tmpfs", entry
        assert entry.size_bytes == SHM_SIZE_BYTES, entry
        assert entry.lacks() == [], f"{uuid} lacks {entry.lacks()}"
        status = os.stat(mps_host.shm_root / uuid)
        assert status.st_mode & 0o7777 == 0o1777, f"{uuid}: mode {status.st_mode & 0o7777:o}"
        assert (status.st_uid, status.st_gid) == (0, 0)
        filesystems.add(status.st_dev)
    assert len(filesystems) == len(devices), "each device has a tmpfs of its own"
    assert os.stat(mps_host.shm_root).st_mode & 0o7777 == 0o700  # clients never see it whole


def test_each_daemon_has_its_own_devices_tmpfs_at_dev_shm(mps_host: MpsHost) -> None:
    # The chart's hostPID: the records' PIDs are this machine's.
    for uuid, record in mps_host.records().items():
        pid, directory = record["pid"], mps_host.shm_root / uuid
        assert record["dir"] == f"{mps_host.config['mps']['shm_root']}/{uuid}", record
        assert "gpushare-fake-mps-control" in Path(f"/proc/{pid}/cmdline").read_text()
        theirs, ours = os.stat(f"/proc/{pid}/root/dev/shm"), os.stat(directory)
        assert (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino), uuid
        mountinfo = shm.read_mountinfo(pid)
        entry = shm.mount_of("/dev/shm", mountinfo)
        assert entry is not None and entry.bounded and entry.size_bytes == SHM_SIZE_BYTES
        others = [e.point for e in shm.parse_mountinfo(mountinfo) if e.point.startswith(
            mps_host.config["mps"]["shm_root"]) and not e.point.endswith(uuid)]  # fmt: skip
        assert others == [], f"daemon {pid} of {uuid} sees other devices' memory: {others}"


def test_a_non_root_client_shares_its_devices_memory_and_the_sticky_bit_holds(
    image: str, mps_host: MpsHost
) -> None:
    first, second = sorted(mps_host.records())[:2]
    device_dir = mps_host.shm_root / first
    made = in_image(image, CLIENT, device_dir, "echo segment > /dev/shm/mps.test.3000")
    assert made.returncode == 0, made.stderr
    segment = device_dir / "mps.test.3000"
    assert segment.read_text() == "segment\n"
    assert os.stat(segment).st_uid == 3000
    assert not (mps_host.shm_root / second / segment.name).exists()  # another device's
    # Another user of the same domain makes its own, but cannot remove the first one's.
    other = in_image(
        image, OTHER, device_dir,
        "touch /dev/shm/mps.test.3001 && rm -f /dev/shm/mps.test.3000; echo rm=$?",
    )  # fmt: skip
    assert "rm=1" in other.stdout and "Operation not permitted" in other.stderr, other
    assert segment.exists() and (device_dir / "mps.test.3001").exists()
    # Bounded: a client cannot fill more than the set size.
    mib = SHM_SIZE_BYTES // 1024**2 + 8
    fill = in_image(
        image, CLIENT, device_dir,
        f"dd if=/dev/zero of=/dev/shm/fill bs=1M count={mib} 2>&1; rm -f /dev/shm/fill",
    )  # fmt: skip
    assert "No space left on device" in fill.stdout, fill


def test_sigterm_quits_the_daemons_and_takes_their_memory_down(mps_host: MpsHost) -> None:
    pids = [record["pid"] for record in mps_host.records().values()]
    stopped = run("stop", "-t", "30", mps_host.name, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert mounts_under(mps_host.shm_root) == {}, mps_host.logs()
    assert sorted(p.name for p in mps_host.shm_root.iterdir()) == [".domains"]
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    state = run("inspect", "--format", "{{.State.ExitCode}}", mps_host.name)
    assert state.stdout.strip() == "0", mps_host.logs()
