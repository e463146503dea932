"""Shared memory of each MPS device: its own size-bounded tmpfs, seen only by its server
and by the containers of one trust domain at a time.

An MPS server creates its ``mps.shm.<uid>.<pid>`` regions in ``/dev/shm`` and every client
maps them, so server and clients must see the same directory there. One directory for the
whole node lets every tenant read and fill every other's, so with ``mps.shm_root`` set:

- **Layout.** ``<shm_root>`` (0700, root's: clients never see it whole) holds one
  directory per device, ``<shm_root>/<device UUID>``, each a tmpfs of its own
  (``size=<mps.shm_size>,mode=1777,nosuid,nodev,noexec``), and ``<shm_root>/.domains/<UUID>``,
  the trust domain the directory last served (outside the directory: no client sees or
  changes it). Mode 1777: the server runs as the client's UID (one server per UID) and
  creates its regions there, and a client may make its own; the sticky bit keeps one UID
  from removing another's files. Everyone who sees the directory is of one trust domain.
- **How the server gets it.** Whoever starts the device's control daemon (the agent, or
  ``gpushare mps host``) mounts the tmpfs, then starts the daemon through
  :mod:`agent.mps.shmexec`: a mount namespace of its own where the directory is bound on
  ``/dev/shm`` and the other devices' directories are detached. The daemon's servers are
  its children and see the same. Client containers get the directory at ``/dev/shm``
  from the agent (CDI spec, Allocate, NRI): :meth:`SupervisedMpsManager.shm_dir`.
- **The record.** The starter writes ``<mps root>/<UUID>/shm.json`` (PID, start time, the
  directory, or why none) before the daemon runs, so whoever adopts the daemon knows what
  its servers see; where it can, the adopter checks it (``/proc/<pid>/root/dev/shm`` is
  the directory). A daemon without a valid record was started by an earlier release (or
  with ``mps.shm_root`` empty): it is **legacy**, its servers share the starter's
  ``/dev/shm``, and its clients keep getting ``kubelet.shm_dir`` / ``dra.shm_dir`` until
  the device has no lease; then it is quit and started again in its namespace.
- **A trust domain changes** (the first share of another domain is handed a container:
  :meth:`agent.mps.shmclaim.DeviceMemory.claim`): the device's servers are shut down, the
  directory emptied, the new domain recorded, and the daemon's defaults set again and read
  back, all before the container is named the directory.
- **Fallback.** Not root, or no mount namespace can be made (the probe, once per start),
  or the tmpfs cannot be mounted: the daemon shares its starter's ``/dev/shm`` as before,
  with a warning, the event ``mps.shm_shared`` and the reason in the record, which
  ``gpushare doctor`` reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from agent.mps import daemon as proc
from agent.mps import shmexec
from agent.mps.limits import DaemonPaths
from agent.mps.options import SupervisorOptions
from agent.mps.shmstate import DOMAINS, OFF, ROOT_MODE, Isolation, ShmOptions, record_path

log = logging.getLogger(__name__)

SHM_MODE = 0o1777
MOUNT_OPTIONS = ("nosuid", "nodev", "noexec")
PROBE_TIMEOUT_S = 10.0


def decide(options: ShmOptions, *, euid: int, probe_error: str) -> Isolation:
    """Per-device shared memory where it is asked for and this process can make it: root
    (mount(2) of a tmpfs) and a mount namespace (the probe). Pure."""
    if not options.enabled:
        return OFF
    if euid != 0:
        return Isolation(
            False, f"not root (uid {euid}): cannot mount a tmpfs or make a mount namespace"
        )
    if probe_error:
        return Isolation(False, f"cannot make a mount namespace: {probe_error}")
    return Isolation(True)


async def probe_namespace() -> str:
    """ "" when this process may make a mount namespace and mount a tmpfs in it, else why
    not (asked of a child, so that nothing here changes)."""
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent.mps.shmexec",
            "--probe",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        return f"cannot run {sys.executable}: {exc.strerror}"
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=PROBE_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        return f"the probe did not end within {PROBE_TIMEOUT_S:g} s"
    if process.returncode == 0:
        return ""
    text = out.decode(errors="replace").strip().splitlines()
    return (text[-1] if text else f"exit status {process.returncode}").removeprefix(
        "gpushare: cannot give the MPS daemon its shared memory: "
    )


async def isolation_here(options: ShmOptions) -> Isolation:
    """:func:`decide` for this process (the probe only where it is root), with a warning
    when per-device shared memory is asked for and cannot be had."""
    if not options.enabled:
        return OFF
    euid = os.geteuid()
    isolation = decide(options, euid=euid, probe_error=await probe_namespace() if euid == 0 else "")
    if not isolation.isolated:
        log.warning(
            "mps.shm_root is set, but the MPS daemons started here share this process's "
            "/dev/shm with every tenant of the node: %s",
            isolation.reason,
        )
    return isolation


# -- mounts ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MountEntry:
    """One line of /proc/<pid>/mountinfo: the mount point, its filesystem, the per-mount
    options (``nosuid``...) and the filesystem's own (``size=1048576k``)."""

    point: str
    fstype: str
    options: frozenset[str]
    super_options: dict[str, str]

    @property
    def size_bytes(self) -> int | None:
        """A tmpfs's size (its ``size=`` in KiB as the kernel prints it)."""
        return _kernel_size(self.super_options.get("size", ""))

    @property
    def bounded(self) -> bool:
        return self.fstype == "tmpfs" and bool(self.size_bytes)

    def lacks(self) -> list[str]:
        """The required per-mount options this mount lacks."""
        return [o for o in MOUNT_OPTIONS if o not in self.options]


def _kernel_size(text: str) -> int | None:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    if not text:
        return None
    if text[-1].lower() in units and text[:-1].isdigit():
        return int(text[:-1]) * units[text[-1].lower()]
    return int(text) if text.isdigit() else None


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Every mount of a mountinfo text, in its order (a later one over an earlier one)."""
    entries = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 6 or len(rest) < 3:
            continue
        supers = {}
        for option in rest[2].split(","):
            key, _, value = option.partition("=")
            supers[key] = value
        entries.append(
            MountEntry(
                shmexec.unescape(fields[4]), rest[0], frozenset(fields[5].split(",")), supers
            )
        )
    return entries


def mount_of(path: str, mountinfo: str) -> MountEntry | None:
    """The mount on top at ``path`` exactly, if one is."""
    path = path.rstrip("/") or "/"
    found = [e for e in parse_mountinfo(mountinfo) if e.point == path]
    return found[-1] if found else None


def read_mountinfo(pid: int | str = "self") -> str:
    with open(f"/proc/{pid}/mountinfo") as f:
        return f.read()


def prepare_dir(options: ShmOptions, device_uuid: str) -> str:
    """``<root>/<uuid>``, a tmpfs of the configured size with the required options (mounted
    when it is none, remounted when its size or options differ); the root 0700."""
    for directory in (options.root, f"{options.root}/{DOMAINS}"):
        os.makedirs(directory, mode=ROOT_MODE, exist_ok=True)
        os.chmod(directory, ROOT_MODE)
    path = options.device_dir(device_uuid)
    os.makedirs(path, exist_ok=True)
    entry = mount_of(path, read_mountinfo())
    if entry is None or entry.fstype != "tmpfs":
        shmexec.mount_tmpfs(path, options.size_bytes, SHM_MODE)
        log.info("MPS shared memory of %s: tmpfs of %d bytes", device_uuid, options.size_bytes)
    elif entry.size_bytes != options.size_bytes or entry.lacks():
        shmexec.mount(
            None,
            path,
            None,
            shmexec.MS_REMOUNT | shmexec.SHM_FLAGS,
            f"size={options.size_bytes},mode={SHM_MODE:o}",
        )
        log.info("MPS shared memory of %s: remounted, %d bytes", device_uuid, options.size_bytes)
    return path


def release_dir(options: ShmOptions, device_uuid: str) -> None:
    """Detach the device's tmpfs (containers that hold it keep theirs) and remove the
    directory. Harmless when there is none. The record of its trust domain stays: the next
    tmpfs is empty, and is handed to that domain as it is, to another only emptied."""
    path = options.device_dir(device_uuid)
    with contextlib.suppress(OSError):
        while mount_of(path, read_mountinfo()) is not None:
            shmexec.detach(path)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def launch_prefix(
    options: ShmOptions, isolation: Isolation, device_uuid: str, record: str
) -> tuple[list[str], Isolation]:
    """What a daemon of ``device_uuid`` is started through (prepended to its command), and
    the isolation it really gets: a directory that cannot be mounted falls back to shared."""
    if not options.enabled:
        return [], isolation
    helper = [sys.executable, "-m", "agent.mps.shmexec", "--record", record]
    if isolation.isolated:
        try:
            path = prepare_dir(options, device_uuid)
        except OSError as exc:
            isolation = Isolation(False, f"cannot mount a tmpfs on its directory: {exc}")
        else:
            return [*helper, "--shm", path, "--root", options.root, "--"], isolation
    return [*helper, "--shared", isolation.reason, "--"], isolation


async def spawn(
    options: SupervisorOptions,
    env: Mapping[str, str],
    paths: DaemonPaths,
    *,
    isolation: Isolation,
) -> proc.DaemonProcess:
    """Start the daemon of ``paths.device_uuid`` (``options.binary``, ``multi_user``) with
    the shared memory ``isolation`` allows (through :mod:`agent.mps.shmexec`, which writes
    its record); a record left by a predecessor goes first, so that none outlives its
    daemon. The one start of a daemon, whoever keeps it: the agent's supervisor
    (:class:`agent.mps.shmclaim.DeviceMemory`) or ``gpushare mps host``."""
    prefix = await asyncio.to_thread(_prepare_launch, options.shm, isolation, paths)
    return await proc.DaemonProcess.spawn(
        options.binary, env, paths, multi_user=options.multi_user, prefix=prefix
    )


def _prepare_launch(options: ShmOptions, isolation: Isolation, paths: DaemonPaths) -> list[str]:
    """The old record removed and the device's directory made (a tmpfs mounted, the
    mount table read): blocking, in a worker thread."""
    record = record_path(paths.base)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record)
    prefix, _given = launch_prefix(options, isolation, paths.device_uuid, record)
    return prefix
