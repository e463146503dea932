"""What a device's MPS servers have at /dev/shm, and which trust domain it last served:
the options, the daemon's record and what an adopter makes of it, the domain record, and
emptying the directory. Pure, or small file operations (see :mod:`agent.mps.shm`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from agent.config.mps import MpsSettings
from agent.core.lease import Lease
from agent.mps import shmexec

RECORD = "shm.json"  # in <mps root>/<uuid>/, beside pipe/ and log/
DOMAINS = ".domains"
ROOT_MODE = 0o700
NO_ROOT = "mps.shm_root is empty"
start_time = shmexec.start_time  # of a process, in clock ticks since boot


@dataclass(frozen=True, slots=True)
class ShmOptions:
    """``mps.shm_root`` and ``mps.shm_size``; ``root`` empty: no shared memory per device."""

    root: str = ""
    size_bytes: int = 0

    @classmethod
    def of(cls, settings: MpsSettings) -> ShmOptions:
        return cls(settings.shm_root.rstrip("/"), settings.shm_size_bytes)

    @property
    def enabled(self) -> bool:
        return bool(self.root)

    def device_dir(self, device_uuid: str) -> str:
        return f"{self.root}/{device_uuid}"

    def domain_file(self, device_uuid: str) -> str:
        return f"{self.root}/{DOMAINS}/{device_uuid}"


NO_SHM = ShmOptions()


@dataclass(frozen=True, slots=True)
class Isolation:
    """Whether the daemons this process starts get shared memory of their own, else why not."""

    isolated: bool
    reason: str = ""


OFF = Isolation(False, NO_ROOT)


# -- what a daemon sees ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DaemonRecord:
    """``shm.json``: the daemon process (PID and start time) and what it sees at /dev/shm
    (``directory`` "" with the ``reason``)."""

    pid: int
    start: int | None
    directory: str
    reason: str


def record_path(base: str) -> str:
    return f"{base}/{RECORD}"


def read_record(path: str) -> DaemonRecord | None:
    try:
        with open(path) as f:
            data = json.load(f)
        start = data.get("start")
        return DaemonRecord(
            int(data["pid"]),
            int(start) if start is not None else None,
            str(data.get("dir", "")),
            str(data.get("reason", "")),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def sees(pid: int, directory: str) -> bool | None:
    """Whether process ``pid`` has ``directory`` at /dev/shm (same filesystem and inode, as
    seen through its own mount namespace); None when this process cannot look."""
    try:
        theirs = os.stat(f"/proc/{pid}/root{shmexec.DEV_SHM}")
        ours = os.stat(directory)
    except OSError:
        return None
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


Kind = Literal["off", "own", "shared", "legacy", "mismatch"]


@dataclass(frozen=True, slots=True)
class ShmState:
    """What a device's daemon gives its servers at /dev/shm.

    ``own``: the device's directory (``directory``). ``shared``: its starter's /dev/shm,
    because that starter could not isolate it (``reason``). ``legacy``: no record of this
    daemon (an earlier release started it). ``mismatch``: a record that the daemon or this
    process's view contradicts: nothing is handed out. ``off``: mps.shm_root empty."""

    kind: Kind
    directory: str = ""
    reason: str = ""


def judge(
    options: ShmOptions,
    device_uuid: str,
    *,
    pid: int,
    start: int | None,
    record: DaemonRecord | None,
    seen: bool | None,
) -> ShmState:
    """What daemon ``pid`` (started at ``start``) gives its servers, from its record and, where
    it could be looked at, what it really has at /dev/shm (``seen``). Pure."""
    if not options.enabled:
        return ShmState("off", reason=NO_ROOT)
    wanted = options.device_dir(device_uuid)
    valid = (
        record is not None
        and record.pid == pid
        and (record.start is None or start is None or record.start == start)
    )
    if seen:
        return ShmState("own", wanted)
    if valid and record is not None and record.directory:
        if record.directory.rstrip("/") != wanted:
            return ShmState(
                "mismatch",
                reason=f"daemon {pid} was given {record.directory}, not {wanted} "
                "(mps.shm_root changed under a running daemon?)",
            )
        if seen is False:
            return ShmState(
                "mismatch",
                reason=f"daemon {pid} should have {wanted} at /dev/shm but has not: the "
                f"directory seen here is not the one it was given (is {options.root} "
                "mounted with the same propagation here as where the daemon was started?)",
            )
        return ShmState("own", wanted)
    if valid and record is not None:
        return ShmState("shared", reason=record.reason or "its starter could not isolate it")
    return ShmState(
        "legacy",
        reason=f"daemon {pid} has no record of its shared memory (started by an earlier "
        "release, or with mps.shm_root empty): it shares its starter's /dev/shm",
    )


# -- trust domains ---------------------------------------------------------------------------


def sole_on_device(lease: Lease, leases: Iterable[Lease]) -> bool:
    """Whether ``lease`` is the only one of ``leases`` (the live ones) on its device: then a
    legacy daemon of the device may be quit and started again with memory of its own
    (``sole`` of ``claim_shm``)."""
    return not any(
        x.device_uuid == lease.device_uuid and x.lease_id != lease.lease_id for x in leases
    )


def domain_of(options: ShmOptions, device_uuid: str) -> str | None:
    """The trust domain the device's directory last served; None when it served none."""
    try:
        with open(options.domain_file(device_uuid)) as f:
            return f.read().rstrip("\n")
    except FileNotFoundError:
        return None


def set_domain(options: ShmOptions, device_uuid: str, domain: str) -> None:
    path = options.domain_file(device_uuid)
    os.makedirs(os.path.dirname(path), mode=ROOT_MODE, exist_ok=True)
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{domain}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def empty(directory: str) -> int:
    """Remove everything in ``directory`` (never following a link); how many entries."""
    removed = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
            removed += 1
    return removed
