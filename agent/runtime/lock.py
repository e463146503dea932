"""One agent per socket: an exclusive ``flock`` on ``<socket>.lock`` held for the process's life.

The kernel drops the lock when the process dies, even by ``kill -9``, so a crash never
leaves a lock that blocks the next start. Only the holder of the lock may remove a stale
socket file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from agent.core.errors import AlreadyRunningError, ConfigError


class InstanceLock:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.path = f"{socket_path}.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ConfigError(
                "api.unix_socket", f"cannot open the instance lock {self.path}: {exc.strerror}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise AlreadyRunningError(
                f"another gpushare agent{f' (pid {holder})' if holder else ''} is already "
                f"serving on {self.socket_path}; stop it first or give this one another "
                "--socket / api.unix_socket"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # stale: its owner is gone, we hold the lock

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        os.close(self._fd)
        self._fd = None


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None
