"""A kubelet plugin's Unix socket: what a previous run left there, and what tells one file
at a path from the next one created there (how a plugin notices the kubelet emptied its
directory)."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

log = logging.getLogger(__name__)

FileId = tuple[int, int, int]


def remove_stale_socket(path: Path) -> bool:
    """Remove what a previous run left at a socket path we serve (a socket nobody serves,
    or any other file); False, and nothing removed, when a directory is there."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return True
    if stat.S_ISDIR(mode):
        return False
    log.info("removing the stale socket %s", path)
    path.unlink(missing_ok=True)
    return True


def file_id(path: Path) -> FileId | None:
    """What tells one file at ``path`` from the next one created there (inode numbers can
    be reused at once, so the change time is part of it); None when there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns
