"""A process's identity, read from /proc: its start time, its cgroup, and the lease hint.

The hint (``GPUSHARE_LEASE_ID``) is found by scanning ``/proc/<pid>/environ`` in chunks for
that one key; nothing else of a tenant's environment is kept (see
:func:`agent.core.identity.marker_from_chunks`). Identities are cached per (PID, start
time), so a PID the kernel reuses is read afresh, and the cache forgets PIDs that are gone.
Blocking: callers run these in a thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from agent.core.identity import (
    CgroupFacts,
    ProcessIdentity,
    marker_from_chunks,
    parse_cgroup,
    start_time_ticks,
)
from agent.mps.limits import LEASE_MARKER_VAR

CHUNK_BYTES = 4096
MAX_CACHED = 4096
PROC = "/proc"


def read_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``; ``None`` when there is no such process."""
    try:
        with open(f"{PROC}/{pid}/stat") as f:
            return start_time_ticks(f.read())
    except (OSError, ValueError, IndexError):
        return None


def read_cgroup(pid: int) -> CgroupFacts:
    try:
        with open(f"{PROC}/{pid}/cgroup") as f:
            return parse_cgroup(f.read())
    except OSError:
        return CgroupFacts()


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while chunk := f.read(CHUNK_BYTES):
        yield chunk


def read_lease_hint(pid: int) -> str | None:
    """``GPUSHARE_LEASE_ID`` from the process's environment, and nothing else of it."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb", buffering=0) as f:
            return marker_from_chunks(_chunks(f), LEASE_MARKER_VAR)
    except OSError:
        return None


def read_identity(pid: int) -> ProcessIdentity | None:
    """The process's identity; ``None`` when it is gone (or its PID was reused meanwhile)."""
    start = read_start_time(pid)
    if start is None:
        return None
    identity = ProcessIdentity(pid, start, read_cgroup(pid), read_lease_hint(pid))
    return identity if read_start_time(pid) == start else None


class IdentityCache:
    """Identities per (PID, start time), bounded; safe to use from several threads."""

    def __init__(self, *, max_entries: int = MAX_CACHED) -> None:
        self._max = max_entries
        self._entries: dict[int, ProcessIdentity] = {}
        self._lock = threading.Lock()

    def lookup(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        """The identity of each PID still there (blocking: reads /proc)."""
        wanted = set(pids)
        with self._lock:
            found = {pid: ident for pid in wanted if (ident := self._one(pid)) is not None}
            self._evict(wanted)
        return found

    def cached(self) -> set[tuple[int, int]]:
        """(PID, start time) of what the cache holds."""
        with self._lock:
            return {(i.pid, i.start_time_ticks) for i in self._entries.values()}

    def _one(self, pid: int) -> ProcessIdentity | None:
        start = read_start_time(pid)
        cached = self._entries.get(pid)
        if cached is not None and start is not None and cached.start_time_ticks == start:
            return cached
        identity = read_identity(pid)
        if identity is None:
            self._entries.pop(pid, None)
        else:
            self._entries[pid] = identity
        return identity

    def _evict(self, wanted: set[int]) -> None:
        for pid, ident in list(self._entries.items()):
            if pid not in wanted and read_start_time(pid) != ident.start_time_ticks:
                del self._entries[pid]
        while len(self._entries) > self._max:
            del self._entries[next(iter(self._entries))]
