"""One agent per node: exclusive ``flock`` locks held for the process's life on the socket
(``<socket>.lock``), the state directory (``agent.lock`` in it) and the MPS root
(``<root>.lock`` beside it), so a
second agent fails whatever flags it is given, before it touches anything of the first's.

The kernel drops the locks when the process dies, even by ``kill -9``, so a crash never
leaves a lock that blocks the next start. Only the holder of the lock may remove a stale
socket file. Each lock file holds the holder's PID and socket, for the refusal's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path

from agent.core.errors import AlreadyRunningError, ConfigError

LOCK_NAME = "agent.lock"
log = logging.getLogger(__name__)


class InstanceLock:
    def __init__(self, socket_path: str, *, state_dir: str = "", mps_root: str = "") -> None:
        self.socket_path = socket_path
        self.path = f"{socket_path}.lock"
        self._guarded = [(self.path, f"the socket {socket_path}", "api.unix_socket")]
        if state_dir:
            where = f"the state directory {state_dir}"
            self._guarded.append((f"{state_dir}/{LOCK_NAME}", where, "paths.state_dir"))
        if mps_root:  # beside it: the MPS root holds the daemons' directories only
            where = f"the MPS root {mps_root}"
            self._guarded.append((f"{mps_root.rstrip('/')}.lock", where, "mps.root_dir"))
        self._fds: list[int] = []

    def acquire(self) -> None:
        try:
            for path, what, key in self._guarded:
                self._fds.append(self._take(path, what, key))
        except BaseException:
            self._close_all()
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # stale: its owner is gone, we hold the lock

    async def acquire_waiting(self, wait_s: float, *, poll_s: float = 0.2) -> None:
        """:meth:`acquire`, trying again for up to ``wait_s`` while another agent holds a
        lock (an upgrade: the new agent starts while the old one stops). Nothing is
        touched while waiting; each try takes all the locks or none."""
        deadline_s = time.monotonic() + wait_s
        said = False
        while True:
            try:
                self.acquire()
                return
            except AlreadyRunningError as exc:
                if time.monotonic() >= deadline_s:
                    raise
                if not said:
                    log.warning("%s; waiting up to %.0fs for it to stop", exc, wait_s)
                    said = True
            await asyncio.sleep(poll_s)

    def _take(self, path: str, what: str, key: str) -> int:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ConfigError(key, f"cannot open the instance lock {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").split()
            os.close(fd)
            pid = f" (pid {holder[0]}, socket {' '.join(holder[1:])})" if holder else ""
            raise AlreadyRunningError(
                f"another gpushare agent{pid} already uses {what}: one agent per node; "
                "stop it first (this one touched nothing)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {self.socket_path}\n".encode())
        return fd

    def release(self) -> None:
        if not self._fds:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self._close_all()

    def _close_all(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
