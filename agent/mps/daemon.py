"""One control daemon process on disk and in the process table.

Start: clear what a *dead* daemon left behind (the directories are prepared by
:mod:`agent.mps.pipes`), and run the binary in the foreground (``-f``, umask 077) in its own
session (through :mod:`agent.mps.shmexec` when it gets shared memory of its own, see
:mod:`agent.mps.shm`) with its log going to ``control.log`` (a
file, not a pipe, so the daemon outlives an agent crash and is adopted by the next agent).
A daemon found alive holds the POSIX lock on ``control_lock``; its files are never touched.
Stop: ``quit -t``, wait, SIGTERM, SIGKILL, then remove the directories. Every step is logged
and stopping twice is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess  # noqa: TID251 (a daemon must outlive the agent: see DaemonProcess)
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.core.errors import MpsError
from agent.mps.limits import DaemonPaths
from agent.mps.pipes import DAEMON_UMASK

log = logging.getLogger(__name__)

STALE_NAMES = (
    "control",
    "control_privileged",
    "control_lock",
    "log",
    "nvidia-cuda-mps-control.pid",
)


def lock_holder(pipe_dir: str) -> int | None:
    """PID of the live process holding ``control_lock`` (0 if alive but unknown), else None."""
    path = Path(pipe_dir) / "control_lock"
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    if not _is_locked(path):
        return None
    wanted = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    with contextlib.suppress(OSError), open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if len(fields) > 5 and fields[5] == wanted and fields[4].isdigit():
                return int(fields[4])
    return 0


def _is_locked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops our test lock, if we got it
    return False


def clear_stale_files(pipe_dir: str) -> list[str]:
    """Remove sockets, lock and pid files of a dead daemon. Refuses if one is alive."""
    holder = lock_holder(pipe_dir)
    if holder is not None:
        raise MpsError(f"a live control daemon (pid {holder or '?'}) uses {pipe_dir}")
    removed = []
    for name in STALE_NAMES:
        path = Path(pipe_dir) / name
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(name)
    return removed


_LEFT_RUNNING: list[subprocess.Popen[bytes]] = []  # children kept for the next agent


class DaemonProcess:
    """A running daemon: our child, or one adopted from a previous agent (by PID).

    A child is a plain ``subprocess.Popen``, not an asyncio subprocess: asyncio kills a
    child whose transport is closed, and a daemon must be able to outlive the agent."""

    def __init__(self, pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self._process = process

    @property
    def adopted(self) -> bool:
        return self._process is None

    @classmethod
    async def spawn(
        cls,
        binary: str,
        env: Mapping[str, str],
        paths: DaemonPaths,
        *,
        multi_user: bool,
        prefix: Sequence[str] = (),
    ) -> DaemonProcess:
        """Start the daemon; ``prefix`` runs first and ``exec``s it (same PID): the shared
        memory of its own (:mod:`agent.mps.shmexec`)."""
        args = ["-f", *(["-M"] if multi_user else [])]
        # A quick local open; the daemon then writes its log straight into the file.
        with open(Path(paths.log_dir) / "control.log", "ab") as log_file:  # noqa: ASYNC230
            try:
                process = await asyncio.to_thread(
                    subprocess.Popen,
                    [*prefix, binary, *args],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **env},
                    start_new_session=True,
                    umask=DAEMON_UMASK,
                )
            except OSError as exc:
                raise MpsError(f"cannot start {binary}: {exc.strerror}") from exc
        return cls(process.pid, process)

    def leave_running(self) -> None:
        """The agent stops; the daemon does not (the next agent adopts it by its lock)."""
        if self._process is not None:
            _LEFT_RUNNING.append(self._process)  # never collected: no still-running warning

    def alive(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _is_zombie(self.pid)

    async def wait_exit(self) -> int | None:
        """Wait until the daemon exits; its status when it was our child.

        A process file descriptor becomes readable when the process ends (child or not),
        so nothing polls; where the kernel has none, the process table is polled."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pidfd = None
        try:
            if pidfd is not None and self.alive():
                await _readable(pidfd)
            while self.alive():  # noqa: ASYNC110 (no pidfd: no exit notification)
                await asyncio.sleep(0.1 if self._process is not None else 0.2)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        return self._process.returncode if self._process is not None else None

    async def wait_exit_for(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self.wait_exit(), timeout=max(timeout_s, 0.01))
        except TimeoutError:
            return False
        return True

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self._process is not None:
                self._process.send_signal(signum)
            else:
                os.kill(self.pid, signum)

    async def kill(self) -> None:
        self.send(signal.SIGKILL)
        await self.wait_exit_for(5.0)


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _is_zombie(pid: int) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
    return False


def exit_text(status: int | None) -> str:
    """How a daemon ended, in words: ``None`` is an adopted daemon (not our child)."""
    if status is None:
        return "exited (adopted, so its exit status is unknown)"
    if status < 0:
        return f"was killed by signal {-status} ({_signal_name(-status)})"
    return f"exited with status {status}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


async def stop_ladder(
    process: DaemonProcess, *, quit_sent: bool, term_wait_s: float, quit_wait_s: float, device: str
) -> str:
    """After ``quit`` (already sent or not), escalate until the daemon is gone."""
    started = time.monotonic()
    if quit_sent and await process.wait_exit_for(quit_wait_s):
        return "quit"
    log.warning("MPS daemon %d of %s still running: sending SIGTERM", process.pid, device)
    process.send(signal.SIGTERM)
    if await process.wait_exit_for(term_wait_s):
        return "SIGTERM"
    log.warning(
        "MPS daemon %d of %s ignored SIGTERM for %.1f s: sending SIGKILL",
        process.pid,
        device,
        time.monotonic() - started,
    )
    await process.kill()
    return "SIGKILL"


def remove_dirs(paths: DaemonPaths) -> None:
    shutil.rmtree(paths.base, ignore_errors=True)
