"""Stopping in escalating steps within one grace period.

Each orderly step gets what is left of the grace period; a step that overruns, or is still
running when a second signal forces the stop, is abandoned (logged, and listed in
``overran``) and the next one runs. Whatever child process is still alive at the end is
sent SIGTERM, then SIGKILL, so the agent never leaves processes behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

import psutil

log = logging.getLogger(__name__)


class ShutdownPlan:
    def __init__(self, *, grace_s: float) -> None:
        self.grace_s = grace_s
        self._deadline: float | None = None
        self._forced = asyncio.Event()
        self.overran: list[str] = []

    def begin(self) -> None:
        if self._deadline is None:
            self._deadline = time.monotonic() + self.grace_s

    def force(self) -> None:
        """Skip what is left of the orderly steps, the running one included (a second signal)."""
        self._deadline = time.monotonic()
        self._forced.set()

    def remaining(self) -> float:
        if self._deadline is None:
            return self.grace_s
        return max(0.0, self._deadline - time.monotonic())

    def share(self, fraction: float) -> float:
        return self.remaining() * fraction

    async def step(self, name: str, action: Coroutine[Any, Any, None]) -> None:
        budget = self.remaining()
        task = asyncio.create_task(action, name=f"shutdown: {name}")
        forced = asyncio.create_task(self._forced.wait())
        try:
            await asyncio.wait(
                [task, forced], timeout=max(budget, 0.01), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            forced.cancel()
            await asyncio.gather(forced, return_exceptions=True)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self.overran.append(name)
            log.warning("shutdown step '%s' abandoned after %.1f s; moving on", name, budget)
        elif not task.cancelled() and (exc := task.exception()) is not None:
            self.overran.append(name)
            log.error("shutdown step '%s' failed: %r; moving on", name, exc, exc_info=exc)


def reap_children(*, timeout_s: float) -> list[int]:
    """Terminate, then kill, every descendant process. Returns the PIDs that had to go."""
    children = psutil.Process().children(recursive=True)
    if not children:
        return []
    for child in children:
        log.warning("terminating leftover child process %d (%s)", child.pid, _name(child))
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _gone, alive = psutil.wait_procs(children, timeout=timeout_s / 2)
    for child in alive:
        log.warning("killing child process %d that ignored SIGTERM", child.pid)
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(alive, timeout=timeout_s / 2)
    return [child.pid for child in children]


def _name(child: psutil.Process) -> str:
    try:
        return child.name()
    except psutil.Error:
        return "?"
