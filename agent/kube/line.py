"""A node's line of binds (see :mod:`agent.kube.binder`). A pod joins at the end; it starts
(is admitted and bound) once the turn before it has ended and, if that one bound a pod, the
kubelet allocated it. A gang's members, committed together, go in right after the turn that
started last, ahead of the pods still waiting: those are not admitted yet, so their leases
will be younger than the members'."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Turn:
    """One pod's place in its node's line. ``ended`` is set once its bind is over;
    ``lease_id`` is then its lease if the pod was bound (the next pod waits for that
    lease's allocation), else "" (nothing of it is left for the kubelet to allocate).
    ``previous`` is the turn it waits for (None once started); ``moved`` wakes it when
    that changes."""

    previous: Turn | None = None
    gang: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    lease_id: str = ""
    ended_at: float = 0.0


@dataclass(eq=False)
class Line:
    """``waiting``: the turns not started, in order; ``started``: the last one started."""

    waiting: list[Turn] = field(default_factory=list)
    started: Turn | None = None

    def join(self) -> Turn:
        """A new turn at the end of the line."""
        turn = Turn(previous=self.waiting[-1] if self.waiting else self.started)
        self.waiting.append(turn)
        return turn

    def join_front(self, count: int) -> list[Turn]:
        """``count`` gang turns, in this order, after the turn started last and any gang
        turns already waiting there, ahead of every other waiting turn."""
        at = 0
        while at < len(self.waiting) and self.waiting[at].gang:
            at += 1
        previous = self.waiting[at - 1] if at else self.started
        turns = []
        for _ in range(count):
            turn = Turn(previous=previous, gang=True)
            turns.append(turn)
            previous = turn
        if at < len(self.waiting):
            self._point(self.waiting[at], previous)
        self.waiting[at:at] = turns
        return turns

    def start(self, turn: Turn) -> None:
        """``turn`` has waited its turn: it is the one started last."""
        if turn in self.waiting:
            self.waiting.remove(turn)
        turn.previous = None
        self.started = turn

    def end(self, turn: Turn, lease_id: str, now: float) -> None:
        """The turn is over (bound with ``lease_id``, or "" for nothing bound). A turn that
        ends before it started leaves the line: the one after it waits for its previous."""
        if turn.ended.is_set():
            return
        if turn in self.waiting:
            at = self.waiting.index(turn)
            if at + 1 < len(self.waiting):
                self._point(self.waiting[at + 1], turn.previous)
            del self.waiting[at]
            turn.previous = None
        turn.lease_id, turn.ended_at = lease_id, now
        turn.ended.set()

    @staticmethod
    def _point(turn: Turn, previous: Turn | None) -> None:
        turn.previous = previous
        turn.moved.set()


async def until_either(waited: Awaitable[Any], moved: asyncio.Event, timeout_s: float) -> bool:
    """Until ``waited`` is done (its result), ``moved`` is set or ``timeout_s`` (False)."""
    first = asyncio.ensure_future(waited)
    second = asyncio.ensure_future(moved.wait())
    try:
        await asyncio.wait((first, second), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
    return bool(first.done() and not first.cancelled() and first.result() is not False)
