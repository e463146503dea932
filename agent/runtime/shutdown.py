"""Stopping in escalating steps within one grace period.

Each orderly step gets what is left of the grace period; a step that overruns is abandoned
(logged) and the next one runs. Whatever child process is still alive at the end is sent
SIGTERM, then SIGKILL, so the agent never leaves processes behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable

import psutil

log = logging.getLogger(__name__)


class ShutdownPlan:
    def __init__(self, *, grace_s: float) -> None:
        self.grace_s = grace_s
        self._deadline: float | None = None

    def begin(self) -> None:
        if self._deadline is None:
            self._deadline = time.monotonic() + self.grace_s

    def force(self) -> None:
        """Skip what is left of the orderly steps (a second signal)."""
        self._deadline = time.monotonic()

    def remaining(self) -> float:
        if self._deadline is None:
            return self.grace_s
        return max(0.0, self._deadline - time.monotonic())

    def share(self, fraction: float) -> float:
        return self.remaining() * fraction

    async def step(self, name: str, action: Awaitable[None]) -> None:
        budget = self.remaining()
        try:
            await asyncio.wait_for(action, timeout=max(budget, 0.01))
        except TimeoutError:
            log.warning("shutdown step '%s' overran its %.1f s; moving on", name, budget)
        except Exception:
            log.exception("shutdown step '%s' failed; moving on", name)
        else:
            log.debug("shutdown step '%s' done", name)


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
