"""The node's event log: one ordered path from a fact to everyone who hears of it.

An event is published (kept in the ring, streamed to watchers, logged as an audit line)
only after the write that makes it true is durable, in the order the store numbered it:
lease events travel in the same commit as their lease (``draft`` + the ledger's write),
observations (``__call__``: a daemon died, a device was drained) are written by the
``writer`` task as soon as they happen, several to a commit. Numbers are dense; each event
carries the boot epoch, so a watcher can tell a restart from a loss. A failed write
publishes nothing; observations are kept (bounded) and written when the store recovers; a
clean stop flushes them. An audit line is one line of bounded length whatever the event
holds: its values are escaped and cut (``audit_text``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from agent.core.errors import StateError
from agent.core.logsafe import escaped
from agent.core.types import Event
from agent.state.port import StateStore, WriteBatch

audit = logging.getLogger("gpushare.audit")
log = logging.getLogger(__name__)
MAX_UNWRITTEN = 10_000  # observations kept while the store cannot write
MAX_AUDIT_VALUE = 128  # characters of a kind, device, lease or owner in an audit line
MAX_AUDIT_MESSAGE = 1024  # and of its message
RETRY_S = 1.0


class EventLog:
    def __init__(self, *, capacity: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        # Called with each observation as it happens (before it is written): the janitor's
        # fault handling must not wait for a store that may be failing.
        self.listeners: list[Callable[[Event], None]] = []
        # Called with each published batch (durable, numbered, in order), after the ring
        # and the watchers have it: what follows the facts (the run-record tracker).
        self.on_publish: list[Callable[[Sequence[Event]], None]] = []
        self._capacity = capacity
        self._ring: list[Event] = []  # dense: _ring[i].seq == _ring[0].seq + i
        self._last_seq = 0
        self._clock = clock
        self._changed = asyncio.Event()
        self._unwritten: list[Event] = []
        self._wake = asyncio.Event()
        self._writing = False
        self._written = asyncio.Event()  # set when no write of observations is in flight
        self._written.set()
        self._store: StateStore | None = None
        self.epoch = 0
        self.dropped_total = 0
        self.owner_of: Callable[[str], str] | None = None  # set once the ledger exists

    async def resume(self, store: StateStore) -> None:
        """Continue after what the store holds (at start, before any new event)."""
        self._store = store
        store.on_published = self.publish
        self.epoch = store.epoch
        last = await store.last_event_seq()
        recent = await store.events_since(max(0, last - self._capacity), limit=self._capacity)
        self._ring = _dense_tail(recent)
        self._last_seq = last

    # -- making and publishing -------------------------------------------------------------

    def draft(
        self,
        kind: str,
        message: str,
        *,
        device_uuid: str | None = None,
        lease_id: str | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> Event:
        """An event not yet numbered: the caller writes it with the fact it tells of. An
        event about a lease records who made it (``owner``), so a watcher is shown only its
        own leases' ids (see agent.api.redact)."""
        attrs = attrs or {}
        if lease_id and "owner" not in attrs and self.owner_of is not None:
            attrs = {**attrs, "owner": self.owner_of(lease_id)}
        return Event(0, self._clock(), kind, message, device_uuid, lease_id, attrs)

    def __call__(
        self,
        kind: str,
        message: str,
        *,
        device_uuid: str | None = None,
        lease_id: str | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> None:
        """Record an observation: the writer stores it, then it is published."""
        event = self.draft(kind, message, device_uuid=device_uuid, lease_id=lease_id, attrs=attrs)
        self._keep([event])
        self._wake.set()
        for listener in self.listeners:
            listener(event)

    def publish(self, events: Sequence[Event]) -> None:
        """The store's hook: ``events`` are durable, numbered, in order."""
        for event in events:
            if event.seq != self._last_seq + 1 and self._ring:
                self._ring = []  # a gap (never expected): the ring restarts dense
            self._ring.append(event)
            self._last_seq = event.seq
            audit.info("event %d %s", event.seq, audit_text(event))
        if len(self._ring) > 2 * self._capacity:
            del self._ring[: len(self._ring) - self._capacity]
        self._changed.set()  # watchers wake once per batch
        self._changed = asyncio.Event()
        for hook in self.on_publish:
            try:
                hook(events)
            except Exception:  # a follower's bug must not stop the facts being told
                log.exception("a follower of the published events failed")

    def _keep(self, events: list[Event]) -> None:
        self._unwritten.extend(events)
        excess = len(self._unwritten) - MAX_UNWRITTEN
        if excess > 0:
            del self._unwritten[:excess]
            self.dropped_total += excess
            log.error("%d observation event(s) dropped: the store cannot write", excess)

    async def writer(self) -> None:
        """Write observations as they come, several to a commit (a supervised task)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self._write_unwritten():
                await asyncio.sleep(RETRY_S)
                self._wake.set()

    async def _write_unwritten(self) -> bool:
        if not self._unwritten or self._store is None:
            return True
        batch, self._unwritten = self._unwritten, []
        self._writing = True
        self._written.clear()
        try:
            await self._store.commit(WriteBatch(events=batch))
        except StateError as exc:
            log.warning("cannot store %d event(s) yet: %s", len(batch), exc)
            self._unwritten = batch + self._unwritten
            return False
        finally:
            self._writing = False
            self._written.set()
        return True

    async def flush(self) -> bool:
        """Write what is waiting (a clean stop). True when nothing is left unwritten."""
        await self._written.wait()
        return await self._write_unwritten()

    async def flush_at_stop(self) -> None:
        if not await self.flush():
            log.warning("%d event(s) could not be written before the stop", len(self._unwritten))

    # -- reading ---------------------------------------------------------------------------

    def since(self, seq: int = 0, *, limit: int | None = None) -> list[Event]:
        """Events after ``seq`` still in the ring (by index: the numbers are dense)."""
        if not self._ring:
            return []
        start = max(0, seq + 1 - self._ring[0].seq)
        end = len(self._ring) if limit is None else start + limit
        return self._ring[start:end]

    async def stored_since(self, seq: int, *, limit: int) -> list[Event]:
        """A page of events after ``seq`` from the store (its reader connection)."""
        if self._store is None:
            return self.since(seq, limit=limit)
        return await self._store.events_since(seq, limit=limit)

    async def first_stored_seq(self) -> int:
        if self._store is None:
            return self.oldest_seq
        return await self._store.first_event_seq() or self._last_seq + 1

    @property
    def oldest_seq(self) -> int:
        """The first seq the ring holds (``last_seq + 1`` when it holds none)."""
        return self._ring[0].seq if self._ring else self._last_seq + 1

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def change(self) -> asyncio.Event:
        """Set by the next published batch. Take it *before* reading ``since``."""
        return self._changed


def audit_text(event: Event) -> str:
    """The audit line of ``event`` after its number: each value escaped and cut (they
    may hold names from an API or a caller), so that one event is one bounded line."""
    return " ".join(
        (
            escaped(event.kind, MAX_AUDIT_VALUE),
            f"device={escaped(event.device_uuid or '-', MAX_AUDIT_VALUE)}",
            f"lease={escaped(event.lease_id or '-', MAX_AUDIT_VALUE)}",
            f"owner={escaped(event.attrs.get('owner') or '-', MAX_AUDIT_VALUE)}",
            escaped(event.message, MAX_AUDIT_MESSAGE),
        )
    )


def _dense_tail(events: list[Event]) -> list[Event]:
    """The longest run at the end of ``events`` whose numbers follow one another."""
    start = len(events)
    while start > 0 and (start == len(events) or events[start - 1].seq == events[start].seq - 1):
        start -= 1
    return events[start:]
