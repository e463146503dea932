"""WatchEvents and WatchEventBatches: numbered events for many watchers, cheaply.

A watcher catches up in pages (from the store's reader while it is behind the ring) and
then follows the ring, woken once per published batch. Each event is serialized once per
view (see :mod:`agent.api.redact`) for every watcher that sends it; a page read from the
store is read and encoded once for every watcher that catches up over it (the pages are
kept, bounded in bytes), and only a few watchers read the store at a time, never while
they send. A watcher with a backlog in the ring shares its pages the same way. Pages are
encoded by one thread per listener, which pauses every ``ENCODE_CHUNK`` events so that
the event loop and the store's writer can take the interpreter lock (50 watchers catching
up in the default pool of worker threads stalled Admit for over a second;
docs/benchmarks.md has the figures since). A watcher is live once it is within
``WATCH_MAX_LAG`` events of the last one; a live watcher that falls more than that behind
is ended with RESOURCE_EXHAUSTED, naming where to resume. A batch stream sends at most one
message per window, so a thousand watchers cost a thousand messages per window, not per
event.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from agent.api import convert, redact
from agent.api.identity import LOCAL, Caller
from agent.api.ports import EventFeed
from agent.core.types import Event

WATCH_PAGE = 500  # events a watcher reads at a time
WATCH_MAX_LAG = 10_000  # a live watcher's bounded send queue, in events
CATCHUP_STREAMS = 4  # watchers reading a page from the store at a time
ENCODED_KEPT = 20_000  # serialized recent events kept for the watchers
INLINE_ENCODE_MAX = 32  # a larger backlog is encoded by the page encoder, not inline
ENCODE_CHUNK = 50  # events the page encoder encodes between two pauses (about 0.7 ms)
ENCODE_PAUSE_S = 0.0002  # the pause: long enough for a waiting thread to take the GIL
PAGES_KEPT_BYTES = 32 * 2**20  # encoded store pages kept for watchers catching up
DEFAULT_WINDOW_S = 0.05
MAX_WINDOW_MS = 10_000
_BATCH_EVENTS_TAG = b"\x0a"  # EventBatch.events: field 1, length-delimited


class EncodedEvents:
    """Events serialized once per view, for every watcher that sends them (bounded,
    newest kept)."""

    def __init__(self) -> None:
        self._by_seq: OrderedDict[tuple[int, int], bytes] = OrderedDict()

    def encode(self, event: Event, caller: Caller = LOCAL) -> bytes:
        return self._encoded(event, redact.event_view(event, caller))

    def _encoded(self, event: Event, view: int) -> bytes:
        data = self._by_seq.get((event.seq, view))
        if data is None:
            data = _encode(event, view)
            self._keep(event.seq, view, data)
        return data

    def _keep(self, seq: int, view: int, data: bytes) -> None:
        self._by_seq[(seq, view)] = data
        if len(self._by_seq) > ENCODED_KEPT:
            self._by_seq.popitem(last=False)


def _encode(event: Event, view: int) -> bytes:
    return convert.event_to_pb(redact.event_as(event, view)).SerializeToString()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def batch_bytes(page: list[bytes]) -> bytes:
    """An EventBatch of already serialized events, without parsing them again."""
    return b"".join(_BATCH_EVENTS_TAG + _varint(len(data)) + data for data in page)


@dataclass(slots=True)
class Page:
    """Serialized events after ``last`` up to the new ``last``, and as one EventBatch
    (made once, when first asked for)."""

    last: int
    events: list[bytes]
    _batch: bytes | None = None

    def batch(self) -> bytes:
        if self._batch is None:
            self._batch = batch_bytes(self.events)
        return self._batch

    @property
    def size(self) -> int:
        """Bytes it may hold: the events, and the batch made of them."""
        return 2 * sum(len(data) for data in self.events)


def _encode_page(last: int, events: list[Event], caller: Caller) -> Page:
    """A page's bytes (kept with the page, not with the recent events) and its batch, made
    by the page encoder in pieces, pausing between them."""
    encoded: list[bytes] = []
    for start in range(0, len(events), ENCODE_CHUNK):
        if start:
            time.sleep(ENCODE_PAUSE_S)
        chunk = events[start : start + ENCODE_CHUNK]
        encoded.extend(_encode(e, redact.event_view(e, caller)) for e in chunk)
    page = Page(events[-1].seq if events else last, encoded)
    page.batch()
    return page


def _audience(caller: Caller) -> str:
    """Callers that see the same bytes of every event share cached pages."""
    return "*" if caller.admin or caller.observer else caller.name


class Watchers:
    def __init__(self, events: EventFeed) -> None:
        self._events = events
        self.wire = EncodedEvents()
        self._catching_up = asyncio.Semaphore(CATCHUP_STREAMS)
        self._pages: OrderedDict[tuple[int, str], Page] = OrderedDict()
        self._pages_bytes = 0
        self._reading: dict[tuple[int, str], asyncio.Future[Page]] = {}
        self._encoder: ThreadPoolExecutor | None = None

    async def begin(self, since_seq: int, context: Any) -> int:
        """The seq a stream starts after; OUT_OF_RANGE beyond the last event; the first
        retained seq in the initial metadata (``gpushare-first-seq``)."""
        if since_seq > self._events.last_seq:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"since_seq {since_seq} is beyond the last event ({self._events.last_seq})",
            )
        last = max(since_seq, await self._events.first_stored_seq() - 1)
        await context.send_initial_metadata((("gpushare-first-seq", str(last + 1)),))
        return last

    async def pages(
        self, last: int, caller: Caller, context: Any, window_s: float = 0.0
    ) -> AsyncIterator[Page]:
        """Encoded pages of the events after ``last``, for ever."""
        live = False
        while True:
            change = self._events.change()
            if last + 1 < self._events.oldest_seq:
                live = False
                page = await self._shared_page(last, caller)
                last = page.last
                if page.events:
                    yield page
                else:  # nothing stored past it (never expected): go on from the ring
                    last = max(last, self._events.oldest_seq - 1)
                continue
            if live and self._events.last_seq - last > WATCH_MAX_LAG:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"this watcher fell {self._events.last_seq - last} events behind; "
                    f"resume with since_seq={last}",
                )
            live = live or self._events.last_seq - last <= WATCH_MAX_LAG
            if self._events.last_seq - last > INLINE_ENCODE_MAX:
                page = await self._shared_page(last, caller, from_ring=True)
                if page.events:
                    last = page.last
                    yield page
                    continue
            events = self._events.since(last, limit=WATCH_PAGE)
            if not events:
                await change.wait()
                if window_s:
                    await asyncio.sleep(window_s)  # let a batch gather
                continue
            last = events[-1].seq
            yield Page(last, [self.wire.encode(event, caller) for event in events])

    async def _shared_page(self, last: int, caller: Caller, *, from_ring: bool = False) -> Page:
        """The page after ``last`` (from the store, or from the ring), read and encoded
        once for everyone who sees it the same way; the store is read by a few watchers at
        a time. A kept page may be shorter than a full one: it ends where it says."""
        key = (last, _audience(caller))
        kept = self._pages.get(key)
        if kept is not None:
            self._pages.move_to_end(key)
            return kept
        reading = self._reading.get(key)
        if reading is None:  # the first to want it reads it; the others wait for that
            reading = asyncio.ensure_future(self._make_page(key, caller, from_ring))
            self._reading[key] = reading
            reading.add_done_callback(lambda _done: self._reading.pop(key, None))
        return await asyncio.shield(reading)

    async def _make_page(self, key: tuple[int, str], caller: Caller, from_ring: bool) -> Page:
        """Read (a few watchers at a time from the store) and encoded off the event loop."""
        last = key[0]
        if from_ring:
            page = await self._encode(last, self._events.since(last, limit=WATCH_PAGE), caller)
        else:
            async with self._catching_up:
                events = await self._events.stored_since(last, limit=WATCH_PAGE)
                page = await self._encode(last, events, caller)
        if page.events:
            self._keep_page(key, page)
        return page

    async def _encode(self, last: int, events: list[Event], caller: Caller) -> Page:
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="watch-encode")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._encoder, _encode_page, last, events, caller)

    def close(self) -> None:
        """Stops the page encoder (a page being encoded is abandoned)."""
        if self._encoder is not None:
            self._encoder.shutdown(wait=False, cancel_futures=True)
            self._encoder = None

    def _keep_page(self, key: tuple[int, str], page: Page) -> None:
        self._pages[key] = page
        self._pages_bytes += page.size
        while self._pages_bytes > PAGES_KEPT_BYTES and len(self._pages) > 1:
            _key, dropped = self._pages.popitem(last=False)
            self._pages_bytes -= dropped.size


def window_s(window_ms: int) -> float:
    """WatchEventsRequest.window_ms in seconds: 0 is the default, capped at 10 s."""
    if window_ms <= 0:
        return DEFAULT_WINDOW_S
    return min(window_ms, MAX_WINDOW_MS) / 1000
