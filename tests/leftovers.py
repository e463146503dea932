"""Processes the test suite leaves behind: agents, MPS daemons and their (fake) servers
that outlive the tests that started them. The suite's processes carry its session mark
in their environment (set before anything starts, inherited by every child), so nothing
else on the machine is taken for one of them."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable

import psutil

SESSION_VAR = "GPUSHARE_TEST_SESSION"

# command lines of what the tests start and must stop
MARKS = ("nvidia-cuda-mps", "gpushare-fake-mps-control", "-m agent", "sleep infinity")


def ours(cmdline: Iterable[str]) -> bool:
    line = " ".join(cmdline)
    return any(mark in line for mark in MARKS)


def mark_session() -> str:
    """This session's mark, in this process's environment: every child inherits it."""
    return os.environ.setdefault(SESSION_VAR, uuid.uuid4().hex)


def snapshot() -> set[tuple[int, float]]:
    """(pid, start time) of every live process of this session's that matches now."""
    mark = os.environ.get(SESSION_VAR, "")
    found = set()
    for process in psutil.process_iter(["pid", "cmdline", "create_time", "status"]):
        info = process.info
        if info["status"] == psutil.STATUS_ZOMBIE or not ours(info["cmdline"] or ()):
            continue
        try:
            if process.pid != os.getpid() and process.environ().get(SESSION_VAR) == mark:
                found.add((info["pid"], info["create_time"]))
        except psutil.Error:
            continue
    return found


def left_behind(before: set[tuple[int, float]], grace_s: float = 10.0) -> list[str]:
    """Matching processes started during the session still alive after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        new = snapshot() - before
        if not new or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    described = []
    for pid, _started in sorted(new):
        try:
            described.append(f"{pid}: {' '.join(psutil.Process(pid).cmdline())}")
        except psutil.Error:
            continue
    return described
