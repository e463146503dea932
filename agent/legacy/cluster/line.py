"""A node's line of binds (see :mod:`agent.legacy.cluster.binder`). A pod joins at the end;
it starts (is admitted and bound) once the turn before it has ended and, if that one bound
a pod, the kubelet allocated it. A gang's members, committed together, go in right after
the turn that started last, ahead of the pods still waiting: those are not admitted yet,
so their leases will be younger than the members'.

A bind whose Binding may have landed ends its turn keeping its lease (the next waits for
that lease's allocation, or its hold, as after a bind that bound); the pod's next try
takes that turn's place (:meth:`Line.rejoin`) instead of waiting for its own lease.

:class:`Lines` holds every node's line and the waiting: for the turn before to start (as
long as that takes: it waits in turn), then for it to end and for the kubelet's allocation
of its lease (or its end), each at most the hold. So when one bind overruns, the turns
behind it go one hold at a time, never together. A node whose agent's NRI plugin is
registered has no line: each container gets its own pod's lease there."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Allocations(Protocol):
    """What the lines read from the agents' cache."""

    def injector(self, node: str) -> str: ...

    async def wait_allocated(self, node: str, lease_id: str, timeout_s: float) -> bool: ...


@dataclass(eq=False)
class Turn:
    """One pod's place in its node's line. ``started`` is set once it has waited its turn,
    ``ended`` once its bind is over; ``lease_id`` is then its lease if the pod was bound
    (the next pod waits for that lease's allocation), else "" (nothing of it is left for
    the kubelet to allocate). ``previous`` is the turn it waits for (None once started);
    ``moved`` wakes it when that changes."""

    previous: Turn | None = None
    gang: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    lease_id: str = ""
    ended_at: float = 0.0
    # the turn after it stopped waiting for it (its bind overran the hold): a lease it is
    # granted now would wait for its Allocate beside that turn's
    overtaken: bool = False


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

    def rejoin(self, earlier: Turn) -> Turn:
        """A turn for a pod's next try after ``earlier``, its last one, ended keeping its
        lease: in ``earlier``'s place (the turn waiting for ``earlier`` waits for this one,
        and this one waits for nobody), or at the front as a gang's turn if the line has
        moved past ``earlier``. Either way before every pod not admitted yet, whose leases
        will be younger."""
        follower = next((t for t in self.waiting if t.previous is earlier), None)
        if follower is None and self.started is not earlier:
            return self.join_front(1)[0]
        turn = Turn(gang=True)
        if follower is not None:
            self._point(follower, turn)
        self.waiting.insert(0, turn)  # the follower, if any, was first: the next after it
        return turn

    def gave_back(self, turn: Turn) -> None:
        """The lease ``turn`` ended with is given back: nothing of it is left for the
        kubelet to allocate, and the turn waiting for it waits no more."""
        turn.lease_id = ""
        for waiting in self.waiting:
            if waiting.previous is turn:
                waiting.moved.set()

    def start(self, turn: Turn) -> None:
        """``turn`` has waited its turn: it is the one started last."""
        if turn in self.waiting:
            self.waiting.remove(turn)
        turn.previous = None
        turn.started.set()
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


class Lines:
    """Every node's line (see the module's text)."""

    def __init__(
        self, allocations: Allocations, *, hold_s: float, clock: Callable[[], float]
    ) -> None:
        self._allocations = allocations
        self._hold_s = hold_s
        self._clock = clock
        self._lines: dict[str, Line] = {}

    def line(self, node: str) -> Line:
        return self._lines.setdefault(node, Line())

    def _lined(self, node: str) -> bool:
        """Binds to ``node`` wait in its line, unless its agent's NRI plugin is registered
        with the runtime (it gives each container its own pod's lease)."""
        return self._allocations.injector(node) != "nri"

    def new_turns(self, node: str, count: int, *, gang: bool = False) -> list[Turn]:
        """Places for binds to ``node``: at the end of its line (a gang's ahead of the pods
        waiting), or in no line, waiting for no other."""
        if not self._lined(node):
            return [Turn(gang=gang) for _ in range(count)]
        line = self.line(node)
        return line.join_front(count) if gang else [line.join() for _ in range(count)]

    def rejoin(self, node: str, kept: Turn | None) -> Turn:
        """A turn for a pod whose lease was granted before this try: in the place of
        ``kept``, its last turn, which ended keeping that lease, else ahead of the pods
        not admitted yet (see :meth:`Line.rejoin`)."""
        if not self._lined(node):
            return Turn(gang=True)
        line = self.line(node)
        return line.rejoin(kept) if kept is not None else line.join_front(1)[0]

    def end(self, node: str, turn: Turn, lease_id: str) -> None:
        self.line(node).end(turn, lease_id, self._clock())

    @contextlib.asynccontextmanager
    async def taken(self, node: str, turn: Turn) -> AsyncIterator[None]:
        """Wait for ``turn``, start it, then run the body; if anything fails before the
        body ended the turn, the turn ends with nothing bound."""
        line = self.line(node)
        try:
            await self.wait(node, turn)  # none to wait for outside a line (NRI)
            line.start(turn)  # started last either way: should the node lose NRI, the next waits
            yield
        except BaseException:
            line.end(turn, "", self._clock())
            raise

    async def wait(self, node: str, turn: Turn) -> None:
        """Until the turn before ``turn`` is over: it started, its bind ended and, if it
        bound a pod, the kubelet allocated that pod's lease (or the lease ended). Its start
        is waited for without a limit (it waits in its own turn, each before it bounded);
        its end and the allocation at most ``hold_s`` each. When a gang goes in ahead
        meanwhile, wait for its last member instead."""
        while (previous := turn.previous) is not None:
            turn.moved.clear()
            await self._wait_over(node, previous, turn.moved)
            if turn.previous is previous and not turn.moved.is_set():
                return

    async def _wait_over(self, node: str, previous: Turn, moved: asyncio.Event) -> None:
        hold_s = self._hold_s
        await until_either(_first(previous.started, previous.ended), moved, None)
        if moved.is_set():
            return
        await until_either(previous.ended.wait(), moved, hold_s)
        if moved.is_set():
            return
        if not previous.ended.is_set():
            log.warning("the bind before this one on %s did not end within %.0f s", node, hold_s)
            previous.overtaken = True
            return
        if not previous.lease_id:
            return
        left_s = max(hold_s - (self._clock() - previous.ended_at), 0.0)
        allocated = self._allocations.wait_allocated(node, previous.lease_id, left_s)
        if not await until_either(allocated, moved, left_s + 1.0) and not moved.is_set():
            log.warning(
                "lease %s on %s was not allocated within %.0f s", previous.lease_id, node, hold_s
            )


async def _first(*events: asyncio.Event) -> None:
    """Until one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def until_either(
    waited: Awaitable[Any], moved: asyncio.Event, timeout_s: float | None
) -> bool:
    """Until ``waited`` is done (its result), ``moved`` is set or ``timeout_s`` (False;
    None: no limit)."""
    first = asyncio.ensure_future(waited)
    second = asyncio.ensure_future(moved.wait())
    try:
        await asyncio.wait((first, second), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
    return bool(first.done() and not first.cancelled() and first.result() is not False)
