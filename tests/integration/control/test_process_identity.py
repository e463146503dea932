"""The /proc reader on real processes: the lease hint alone is kept of a tenant's
environment, the start time tells a reused PID apart, and the cache stays bounded."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from agent.control import processes
from agent.control.processes import (
    IdentityCache,
    read_cgroup,
    read_identity,
    read_lease_hint,
    read_start_time,
)
from agent.core.identity import ProcessIdentity

SECRET = "hunter2-do-not-keep"
GONE_PID = 2**22 + 12345  # above pid_max on common kernels: no such process


@contextmanager
def tenant(lease_id: str = "l-abc") -> Iterator[subprocess.Popen[bytes]]:
    """A process with the lease marker and a secret in its environment, once it has
    exec'd (before that, /proc shows the environment of the forked parent)."""
    env = {**os.environ, "SECRET": SECRET, "GPUSHARE_LEASE_ID": lease_id}
    with subprocess.Popen(["sleep", "30"], env=env) as process:
        try:
            for _ in range(200):
                if read_lease_hint(process.pid) == lease_id:
                    break
                time.sleep(0.01)
            yield process
        finally:
            process.kill()


def test_the_hint_is_read_and_nothing_else_of_the_environment_is_kept() -> None:
    with tenant() as process:
        identity = read_identity(process.pid)
    assert identity is not None and identity.hint == "l-abc"
    assert [f.name for f in dataclasses.fields(ProcessIdentity)] == [
        "pid",
        "start_time_ticks",
        "cgroup",
        "hint",
    ]
    assert SECRET not in repr(identity), "nor in its cgroup facts"


def test_the_hint_is_found_whatever_the_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "CHUNK_BYTES", 7)
    with tenant("l-small-chunks") as process:
        assert read_lease_hint(process.pid) == "l-small-chunks"


def test_a_process_without_the_marker_or_gone_has_no_hint() -> None:
    if "GPUSHARE_LEASE_ID" not in os.environ:
        assert read_lease_hint(os.getpid()) is None
    assert read_lease_hint(GONE_PID) is None
    assert read_identity(GONE_PID) is None
    assert read_start_time(GONE_PID) is None


def test_a_child_starts_later_and_shares_its_parents_cgroup() -> None:
    mine = read_start_time(os.getpid())
    with tenant() as process:
        theirs = read_start_time(process.pid)
        assert read_cgroup(process.pid) == read_cgroup(os.getpid())
    assert mine is not None and theirs is not None and theirs >= mine


def test_identities_are_cached_per_pid_and_start_time(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []

    def counted(pid: int) -> ProcessIdentity | None:
        reads.append(pid)
        return read_identity(pid)

    monkeypatch.setattr(processes, "read_identity", counted)
    cache = IdentityCache()
    with tenant() as process:
        first = cache.lookup([process.pid])
        again = cache.lookup([process.pid])
        assert first == again and reads == [process.pid], "read once while it lives"
        start = first[process.pid].start_time_ticks
        monkeypatch.setattr(processes, "read_start_time", lambda pid: start + 1)
        cache.lookup([process.pid])
        assert reads == [process.pid] * 2, "another start time: another process, read afresh"


def test_the_cache_forgets_pids_that_are_gone_and_stays_bounded() -> None:
    cache = IdentityCache(max_entries=2)
    with tenant() as one, tenant() as two:
        cache.lookup([one.pid, two.pid, os.getpid()])
        assert len(cache.cached()) <= 2
        gone = one.pid
    for _ in range(200):
        cache.lookup([os.getpid()])
        if gone not in {pid for pid, _ in cache.cached()}:
            break
        time.sleep(0.01)
    assert gone not in {pid for pid, _ in cache.cached()}
    assert cache.lookup([GONE_PID]) == {}
