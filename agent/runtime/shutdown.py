"""Stopping in escalating steps within one grace period.

Each orderly step gets what is left of the grace period; a step that overruns, or is still
running when a second signal forces the stop, is abandoned (logged, and listed in
``overran``) and the next one runs. Whatever child process is still alive at the end is
sent SIGTERM, then SIGKILL, so the agent leaves no process behind but the MPS daemons it
was told to keep (``runtime.on_stop: keep``) and their servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Coroutine
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


def reap_children(*, timeout_s: float, keep: Collection[int] = ()) -> list[int]:
    """Terminate, then kill, every descendant process but those in ``keep`` and theirs (MPS
    daemons left running). Returns the PIDs that had to go."""
    kept = set(keep)
    for pid in keep:
        with contextlib.suppress(psutil.Error):
            kept |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    children = [c for c in psutil.Process().children(recursive=True) if c.pid not in kept]
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


async def leases_ended(live: Callable[[], int], *, timeout_s: float) -> int:
    """Wait until ``live()`` is 0 or ``timeout_s`` passed; the count left."""
    deadline = time.monotonic() + timeout_s
    while (left := live()) and time.monotonic() < deadline:
        log.info("draining: %d live lease(s), %.0f s left", left, deadline - time.monotonic())
        await asyncio.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
    return live()
