"""Critical sections that a caller going away cannot cut in half.

A gRPC caller whose deadline passes, a CLI user's Ctrl-C, a stopping server: each cancels
the task that runs the call, at whatever ``await`` it is waiting on. What the agent has
decided by then must still happen as one unit, or not at all:

- :class:`LedgerLock` is the ledger's lock. A decision is made with it held and no
  ``await`` between acquiring it and starting the decision's write. A decision that must
  stay alone until its write is durable (a preemption: nobody may decide against the
  victims' capacity until their eviction is on disk) hands the lock to that write, which
  releases it when it settles. The caller may be cancelled while it waits for the answer;
  the lock is not released by its unwinding.
- :func:`run_to_end` runs a coroutine that writes and then changes memory (a drain: the
  store, then the in-memory set) in a task of its own: a cancelled caller stops waiting,
  the work finishes. A failure nobody awaited any more is logged, never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

_running: set[asyncio.Task[Any]] = set()  # strong references until each task is done


class Held:
    """The lock as one decision holds it."""

    __slots__ = ("until",)

    def __init__(self) -> None:
        self.until: asyncio.Future[Any] | None = None

    def hand_to(self, write: asyncio.Future[Any]) -> None:
        """Keep the lock until ``write`` settles (durable, failed or cancelled), not until
        the body's end: the write releases it."""
        self.until = write


class LedgerLock:
    """One decision at a time on the ledger (see the module's text)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    def locked(self) -> bool:
        return self._lock.locked()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[Held]:
        await self._lock.acquire()  # cancelled here: nothing was decided
        held = Held()
        try:
            yield held
        finally:
            if held.until is None:
                self._lock.release()
            else:
                held.until.add_done_callback(lambda _done: self._lock.release())


async def run_to_end(work: Coroutine[Any, Any, T], *, what: str) -> T:
    """Run ``work`` in a task the caller's cancellation does not reach, and wait for it."""
    task = asyncio.ensure_future(work)
    _running.add(task)
    task.add_done_callback(_running.discard)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda done: _report(done, what))
        raise


def _report(task: asyncio.Task[Any], what: str) -> None:
    """The outcome of work whose caller went away: a failure is logged, not lost."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("%s failed after its caller went away: %s", what, exc)
