"""The node's event log: every action and observation, numbered, kept in memory, streamed
to watchers, written to the store, and logged as an audit line.

Events that belong to a lease change are written in the same transaction as the lease
(``make`` + the caller's commit). Others (``__call__``) are written by the ``persister``
task in small batches. Sequence numbers continue across restarts from the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

from agent.core.errors import StateError
from agent.core.types import Event
from agent.state.port import StateStore

audit = logging.getLogger("gpushare.audit")
RESTART_GAP = 1_000_000
log = logging.getLogger(__name__)


class EventLog:
    def __init__(self, *, capacity: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self.listeners: list[Callable[[Event], None]] = []  # called with each published event
        self._events: deque[Event] = deque(maxlen=capacity)
        self._seq = 0
        self._clock = clock
        self._changed = asyncio.Event()
        self._unsaved: list[Event] = []
        self._store: StateStore | None = None

    async def resume(self, store: StateStore) -> None:
        """Continue after what the store holds (at start, before any new event).

        Numbers published but not yet stored when the last agent died are never reused:
        the sequence skips ahead by ``RESTART_GAP``, so a watcher resuming from any number it
        saw never mistakes a new event for one it already has.
        """
        self._store = store
        last = await store.last_event_seq()
        recent = await store.events_since(
            max(0, last - (self._events.maxlen or 0)), limit=self._events.maxlen or 0
        )
        self._events.extend(e for e in recent if e.seq > self._seq)
        self._seq = max(self._seq, last + RESTART_GAP if last else 0)

    async def stored_since(self, seq: int, *, limit: int) -> list[Event]:
        if self._store is None:
            return self.since(seq)[:limit]
        return await self._store.events_since(seq, limit=limit)

    def make(
        self,
        kind: str,
        message: str,
        *,
        device_uuid: str | None = None,
        lease_id: str | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> Event:
        """Number and publish an event; the caller writes it to the store."""
        self._seq += 1
        event = Event(self._seq, self._clock(), kind, message, device_uuid, lease_id, attrs or {})
        self._events.append(event)
        self._changed.set()
        self._changed = asyncio.Event()
        audit.info(
            "event %d %s device=%s lease=%s %s",
            event.seq,
            kind,
            device_uuid or "-",
            lease_id or "-",
            message,
        )
        return event

    def __call__(
        self,
        kind: str,
        message: str,
        *,
        device_uuid: str | None = None,
        lease_id: str | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> None:
        """Publish an event that the persister writes to the store shortly."""
        event = self.make(kind, message, device_uuid=device_uuid, lease_id=lease_id, attrs=attrs)
        self._unsaved.append(event)
        for listener in self.listeners:
            listener(event)

    def since(self, seq: int = 0) -> list[Event]:
        return [e for e in self._events if e.seq > seq]

    @property
    def oldest_seq(self) -> int:
        return self._events[0].seq if self._events else self._seq + 1

    @property
    def last_seq(self) -> int:
        return self._seq

    def change(self) -> asyncio.Event:
        """Set by the next event. Take it *before* reading ``since`` so no event is missed."""
        return self._changed

    async def persister(self, store: StateStore, *, interval_s: float = 0.2) -> None:
        """Write published events to the store until cancelled (a supervised task)."""
        while True:
            await asyncio.sleep(interval_s)
            if not self._unsaved:
                continue
            batch, self._unsaved = self._unsaved, []
            try:
                await store.commit([], batch)
            except StateError as exc:
                log.warning("cannot store %d event(s) yet: %s", len(batch), exc)
                self._unsaved = (batch + self._unsaved)[-self._events.maxlen :]  # type: ignore[operator]
