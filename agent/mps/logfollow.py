"""Follow a log file that another process appends to, like ``tail -F``, without blocking.

Reads only what was added since the last call; starts over when the file was truncated or
replaced. Partial last lines wait for their newline.
"""

from __future__ import annotations

import os


class LogFollower:
    def __init__(self, path: str, *, from_end: bool = False) -> None:
        self.path = path
        self._offset: int | None = None if from_end else 0
        self._inode: int | None = None
        self._partial = b""

    def read_new_lines(self) -> list[str]:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self._offset is None:  # first look with from_end: skip history
            self._offset, self._inode = stat.st_size, stat.st_ino
            return []
        if stat.st_ino != self._inode or stat.st_size < self._offset:
            self._offset, self._inode, self._partial = 0, stat.st_ino, b""
        if stat.st_size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(stat.st_size - self._offset)
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        return [line.decode(errors="replace") for line in complete if line.strip()]
