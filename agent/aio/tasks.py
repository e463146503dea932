"""Named, supervised asyncio tasks.

Every long-running coroutine is spawned here with a name. When a *core* task ends for any
reason other than cancellation (an exception, or returning at all, since core tasks are
meant to run forever), the supervisor records why and wakes whoever waits in
:meth:`Supervisor.wait`. Nothing is swallowed: the reason is logged with its traceback and
the daemon exits non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._core: set[str] = set()
        self._failed = asyncio.Event()
        self._stopping = False
        self.failure: str | None = None

    @property
    def names(self) -> list[str]:
        return [name for name, task in self._tasks.items() if not task.done()]

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any], *, core: bool = True) -> None:
        if name in self._tasks and not self._tasks[name].done():
            coro.close()
            raise ValueError(f"a task named {name!r} is already running")
        task = asyncio.create_task(coro, name=name)
        self._tasks[name] = task
        if core:
            self._core.add(name)
        task.add_done_callback(self._on_done)

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        name = task.get_name()
        if self._stopping or task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("task %s crashed: %r", name, exc, exc_info=exc)
            reason = f"task {name} crashed: {exc!r}"
        else:
            log.error("task %s exited although it should run until stopped", name)
            reason = f"task {name} exited unexpectedly"
        if name in self._core and self.failure is None:
            self.failure = reason
            self._failed.set()

    async def wait(self, stop: asyncio.Event) -> str | None:
        """Wait until ``stop`` is set (returns None) or a core task fails (returns why)."""
        waiters = [
            asyncio.create_task(stop.wait(), name="supervisor-stop-wait"),
            asyncio.create_task(self._failed.wait(), name="supervisor-failure-wait"),
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        return self.failure

    async def stop(self, *, timeout_s: float) -> list[str]:
        """Cancel every task and wait up to ``timeout_s``. Returns the names that did not end."""
        self._stopping = True
        pending = [task for task in self._tasks.values() if not task.done()]
        for task in pending:
            log.debug("cancelling task %s", task.get_name())
            task.cancel()
        if pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(pending, timeout=max(timeout_s, 0.0))
        stuck = [task.get_name() for task in pending if not task.done()]
        for task in pending:
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.warning(
                    "task %s ended with %r while stopping", task.get_name(), task.exception()
                )
        return stuck
