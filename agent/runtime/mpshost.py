"""The composition root of ``gpushare mps host``: the node's devices, one keeper per MPS
device (agent.mps.host), a lock so that one host runs per MPS root, and the signals that
stop it (SIGTERM, SIGINT: its daemons are quit, then it exits)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal

from agent.config import Settings
from agent.core.errors import AlreadyRunningError, ConfigError
from agent.core.types import SharingMode
from agent.mps.host import MpsHost
from agent.mps.version import check_release
from agent.runtime.wiring import build_gpu, supervisor_options

log = logging.getLogger(__name__)


SHARED_SHM = "/dev/shm"  # what a daemon without a tmpfs of its own shares (its starter's)
SHM_MODE = 0o1777  # as /dev/shm: every client UID makes its segments; the sticky bit keeps
# one UID from removing another's


def open_shared_shm(path: str = SHARED_SHM) -> bool:
    """Give the shared shared-memory directory /dev/shm's mode where it lacks it (a
    Kubernetes hostPath is made 0755 root, which non-root MPS clients cannot write); True
    when it was changed. A missing directory, or one that cannot be changed, is logged."""
    try:
        mode = os.stat(path).st_mode & 0o7777
        if mode == SHM_MODE:
            return False
        os.chmod(path, SHM_MODE)
    except OSError as exc:
        log.warning("MPS host: the shared memory directory %s stays as it is: %s", path, exc)
        return False
    log.info("MPS host: %s made mode 1777 (it was %o) for every client user", path, mode)
    return True


def lock_host(root_dir: str) -> int:
    """An exclusive lock beside the MPS root, held for the host's life."""
    path = f"{root_dir.rstrip('/')}.host.lock"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ConfigError("mps.root_dir", f"cannot open {path}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.close(fd)
        raise AlreadyRunningError(
            f"another MPS host (pid {holder or '?'}) keeps the daemons of {root_dir}"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


async def run_host(settings: Settings) -> None:
    """Keep the daemons until SIGTERM or SIGINT, then quit them."""
    options = supervisor_options(settings)
    fd = lock_host(options.root_dir)
    open_shared_shm()
    gpu = build_gpu(settings)
    try:
        await gpu.start()
        devices = await gpu.list_devices()
        if any(d.sharing_mode is SharingMode.MPS for d in devices):
            check_release(options.binary, await gpu.driver_version())
        host = MpsHost(devices, options, settings.mps.command_timeout_s)
        loop = asyncio.get_running_loop()
        keeping = asyncio.create_task(host.run(), name="mps-host")
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, keeping.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await keeping
        log.info("MPS host: stopping: quitting %d daemon(s)", len(host.keepers))
        await host.stop()
    finally:
        await gpu.aclose()
        os.close(fd)
