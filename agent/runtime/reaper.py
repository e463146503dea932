"""Reap orphans, so no defunct MPS process accumulates.

The agent makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): MPS server
processes orphaned by a killed control daemon become the agent's children instead of
init's, and are stopped with it. This task collects those that exit. It never waits for a
process that asyncio started (control daemons and front-end calls): asyncio collects
those itself, and taking their status would lose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os

import psutil

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def any_child_exited() -> bool:
    """Whether some child has exited and is not collected yet, without collecting it: one
    ``waitid`` call instead of a scan of every process on the node."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # no children at all
        return False


def reap_orphans() -> list[int]:
    """Collect exited children that no one else waits for. Returns their PIDs."""
    if not any_child_exited():
        return []
    reaped = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE or _asyncio_owned(child):
                continue
        with contextlib.suppress(ChildProcessError):
            pid, _status = os.waitpid(child.pid, os.WNOHANG)
            if pid:
                reaped.append(pid)
    return reaped


def _asyncio_owned(child: psutil.Process) -> bool:
    """asyncio's children are the control binaries and fakes we start; orphans are servers."""
    try:
        name = child.name()
    except psutil.Error:
        return True
    return "mps-control" in name or name.startswith("python") or name.startswith("gpushare")


async def orphan_reaper(*, interval_s: float = 1.0) -> None:
    while True:
        for pid in await asyncio.to_thread(reap_orphans):
            log.info("reaped orphaned process %d", pid)
        await asyncio.sleep(interval_s)
