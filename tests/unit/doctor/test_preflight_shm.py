"""The doctor's mps-shm check with per-device shared memory (mps.shm_root): each device's
tmpfs bounded and nosuid,nodev,noexec, the root closed to others and apart from the shared
directory, daemons without their own (legacy, shared: the fallback) reported with why;
without mps.shm_root, one directory for every tenant is a warning."""

from __future__ import annotations

import dataclasses

import pytest

from agent import doctor as pf
from agent.doctor import DeviceShm, PathFacts, ShmFacts

ROOT = "/run/gpushare/shm"
SHARED = "/run/gpushare-shm"


def d(path: str, mode: int) -> PathFacts:
    return PathFacts(path, True, is_dir=True, mode=mode, uid=0, gid=0)


def own(uuid: str, **changes: object) -> DeviceShm:
    values: dict[str, object] = {
        "uuid": uuid,
        "directory": f"{ROOT}/{uuid}",
        "state": "own",
        "fstype": "tmpfs",
        "size_bytes": 1 << 30,
    }
    values.update(changes)
    return DeviceShm(**values)  # type: ignore[arg-type]


FACTS = ShmFacts(
    True,
    SHARED,
    True,
    SHARED,
    d(SHARED, 0o1777),
    shm_root=ROOT,
    root=d(ROOT, 0o700),
    devices=(own("GPU-1"), own("GPU-2")),
)


@pytest.mark.parametrize(
    ("facts", "status", "found", "fix"),
    [
        (FACTS, "ok", "2 device(s) with a tmpfs of their own under /run/gpushare/shm (1.0 GiB", ""),
        (dataclasses.replace(FACTS, devices=()), "ok", "no MPS daemon runs yet", ""),
        (
            dataclasses.replace(FACTS, devices=(own("GPU-1", fstype=""),)),
            "fail",
            "/run/gpushare/shm/GPU-1 is no mount, not a tmpfs",
            "restart the daemon's starter",
        ),
        (
            dataclasses.replace(FACTS, devices=(own("GPU-1", size_bytes=None),)),
            "fail",
            "a tmpfs without a size",
            "",
        ),
        (
            dataclasses.replace(FACTS, devices=(own("GPU-1", lacks=("nodev", "noexec")),)),
            "fail",
            "mounted without nodev,noexec",
            "",
        ),
        (
            dataclasses.replace(FACTS, root=d(ROOT, 0o755)),
            "fail",
            "/run/gpushare/shm is open to other users",
            "chmod 0700 /run/gpushare/shm",
        ),
        (
            dataclasses.replace(FACTS, kubelet_shm_dir="/run", dra_shm_dir="/run"),
            "fail",
            "is inside kubelet.shm_dir /run: a container given /run sees every device's memory",
            "set mps.shm_root outside /run",
        ),
        (
            dataclasses.replace(
                FACTS, devices=(own("GPU-1", state="mismatch", reason="daemon 7 should have"),)
            ),
            "fail",
            "GPU-1: daemon 7 should have",
            "the same way",
        ),
        (
            dataclasses.replace(
                FACTS,
                devices=(
                    own("GPU-1"),
                    own("GPU-2", state="legacy", reason="no record of its shared memory"),
                ),
            ),
            "warn",
            "GPU-2: no record of its shared memory: the containers of these devices share "
            "/run/gpushare-shm",
            "once its device has no lease",
        ),
        (
            dataclasses.replace(
                FACTS,
                kubelet_shm_dir="",
                dra_shm_dir="",
                directory=None,
                devices=(own("GPU-1", state="shared", reason="not root (uid 1000)"),),
            ),
            "warn",
            "GPU-1: not root (uid 1000); kubelet.shm_dir and dra.shm_dir empty",
            "",
        ),
        (
            dataclasses.replace(FACTS, devices=(own("GPU-1", state="none"),)),
            "ok",
            "no MPS daemon runs yet",
            "",
        ),
        (
            dataclasses.replace(FACTS, root=PathFacts(ROOT, False, error="Permission denied")),
            "fail",
            "cannot look at /run/gpushare/shm: Permission denied",
            "",
        ),
        (
            ShmFacts(True, SHARED, True, SHARED, d(SHARED, 0o1777)),
            "warn",
            "/run/gpushare-shm exists, mode 1777: one /dev/shm for every tenant of the node",
            "set mps.shm_root",
        ),
    ],
)
def test_shm_with_a_tmpfs_per_device(facts: ShmFacts, status: str, found: str, fix: str) -> None:
    f = pf.check_shm(facts)
    assert (f.status, f.check) == (status, "mps-shm"), f
    assert found in f.found and fix in f.fix, f
