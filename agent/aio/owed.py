"""Work owed to another system until it is done: one debt and one task per key, tried
again with a doubling back-off until a try settles it; owing a key again wakes its task
rather than starting a second one. Knows nothing of what is owed (the DRA driver's
binding answers use it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

log = logging.getLogger(__name__)


T = TypeVar("T")


class Outcome(Enum):
    """How one try at a claim's answer ended."""

    SETTLED = "settled"  # written, or nothing owed any more (answered, gone, not waiting)
    STALE = "stale"  # the copy written over was not the current one (409, 404): read again
    FAILED = "failed"  # not read or not written (5xx, 4xx, no answer): after a backoff


def doubling(first_s: float, max_s: float) -> Iterator[float]:
    """Delays from ``first_s``, each twice the last, up to ``max_s``."""
    delay_s = first_s
    while True:
        yield delay_s
        delay_s = min(delay_s * 2, max_s)


@dataclass(eq=False)
class Debt(Generic[T]):
    """Work owed for one key: the newest copy of its item seen, and the tries made."""

    item: T
    tries: int = 0
    nudged: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self, delay_s: float) -> None:
        """Until ``delay_s`` has passed, or the key is owed again (a newer copy)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self.nudged.wait()


class Owed(Generic[T]):
    """Work owed per key until a try settles it (returns True). One task per key, however
    often the key is owed again: a newer item replaces the one its debt holds and wakes
    the task (a try at once). A try that does not settle it is followed by the next one
    after a delay doubling from ``first_s`` up to ``max_s`` (or at once, when woken).
    Holds one debt per key owed now, none once settled; a try that raises is logged and
    counts as not settled."""

    def __init__(
        self,
        attempt: Callable[[Debt[T]], Awaitable[bool]],
        *,
        first_s: float,
        max_s: float,
        name: Callable[[T], str],
    ) -> None:
        self._attempt = attempt
        self._first_s, self._max_s = first_s, max_s
        self._name = name
        self._debts: dict[str, Debt[T]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._debts)

    def __contains__(self, key: object) -> bool:
        return key in self._debts

    def owe(self, key: str, item: T) -> None:
        """Owe ``key`` with ``item`` its newest copy: its task started, or woken."""
        debt = self._debts.get(key)
        if debt is not None:
            debt.item = item
            debt.nudged.set()
            return
        debt = self._debts[key] = Debt(item)
        self._tasks[key] = asyncio.create_task(self._pursue(key, debt), name=self._name(item))

    def nudge(self, key: str) -> None:
        """Try ``key`` again now if it is owed (its item may have changed)."""
        if (debt := self._debts.get(key)) is not None:
            debt.nudged.set()

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._debts.clear()  # of tasks cancelled before they began
        self._tasks.clear()

    async def _pursue(self, key: str, debt: Debt[T]) -> None:
        delays_s = doubling(self._first_s, self._max_s)
        try:
            while True:
                debt.nudged.clear()  # a nudge during the try: the next one at once
                settled = await self._try(debt)
                debt.tries += 1
                if settled and not debt.nudged.is_set():
                    return
                if not settled:  # owed again during a try that settled: no wait
                    await debt.wait(next(delays_s))
        finally:
            del self._debts[key], self._tasks[key]

    async def _try(self, debt: Debt[T]) -> bool:
        try:
            return await self._attempt(debt)
        except Exception:
            log.exception("%s failed; tried again", self._name(debt.item))
            return False
