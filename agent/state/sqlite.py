"""SQLite store in WAL mode, with group commit and events numbered in commit order.

Every ``commit`` is queued; one writer task takes whatever has queued up, numbers the
events of the whole batch densely, writes it all in one transaction on the store's own
thread and syncs once (``synchronous=FULL``). Then, on the event loop and in order, it runs
each part's ``on_durable`` (the ledger applies the change), hands the batch's events to
``on_published`` (ring, watchers, audit line) and wakes every caller. So no caller hears
back, and no event is seen, before its rows are on disk; a failed write publishes nothing,
reuses its numbers, fails every caller of that batch with :class:`StateError` and marks the
store unwritable until a write succeeds again. Reads go through :class:`SqliteReader`, on a
connection and a thread of their own. The legacy device plugin's allocation records (rows
of its own port, ``agent.legacy.deviceplugin.records.AllocationStore``) take the same path
(and the same transaction as whatever else their batch holds); the pruner drops them once
their lease has ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent.core.errors import StateError
from agent.core.learning import HistoryRow
from agent.core.lease import Lease
from agent.core.types import Event
from agent.state.migrations import migrate
from agent.state.port import (
    RUN_RECORDS_KEPT,
    AllocationRow,
    Pruned,
    RequestRecord,
    Retention,
    RunRecordRow,
    WriteBatch,
)
from agent.state.reader import SqliteReader
from agent.state.rows import (
    ALLOCATION_DEFERRED,
    ALLOCATION_HANDED,
    ALLOCATION_INSERT,
    ENDED_STATES,
    EVENT_INSERT,
    HISTORY_INSERT,
    LEASE_INSERT,
    LIVE_STATES,
    REQUEST_INSERT,
    RUN_RECORD_INSERT,
    RUN_RECORD_TRIM,
    allocation_row,
    event_row,
    history_row,
    lease_row,
    request_row,
)

log = logging.getLogger(__name__)
Pending = tuple[WriteBatch, asyncio.Future[list[Event]]]


class SqliteStateStore:
    def __init__(self, path: str, *, sync: str = "full") -> None:
        if sync not in ("full", "normal"):
            raise StateError(f"unknown sync mode {sync!r}")
        self.path = path
        self._sync = sync
        self._db: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._queue: asyncio.Queue[Pending] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._writable = True
        self._lock = threading.Lock()
        self._reader = SqliteReader(path)
        self._next_seq = 1
        self._writing = False  # a group-commit batch is between numbering and publishing
        self.epoch = 0
        self.on_published: Callable[[Sequence[Event]], None] = lambda _events: None
        self.batches = 0

    # -- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        await self._run(self._open)
        await self._reader.start(shared=self._db if self.path == ":memory:" else None)
        self._writer = asyncio.create_task(self._write_loop(), name="state-writer")

    def _open(self) -> None:
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={self._sync.upper()}")
            db.execute("PRAGMA busy_timeout=5000")
            migrate(db)
            last = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
            self._next_seq = int(last) + 1
        except (sqlite3.Error, OSError) as exc:
            raise StateError(f"cannot open the state store {self.path}: {exc}") from exc
        self._db = db
        self.epoch = self._next_epoch(db)

    @staticmethod
    def _next_epoch(db: sqlite3.Connection) -> int:
        row = db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
        epoch = int(row[0]) + 1 if row else 1
        db.execute("INSERT OR REPLACE INTO meta VALUES ('epoch', ?)", (str(epoch),))
        return epoch

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None
        await self._reader.aclose()
        if self._executor is not None:
            if self._db is not None:
                await self._run(self._db.close)
            self._executor.shutdown(wait=True)
            self._executor = None
        self._db = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            raise StateError("the state store is not open")
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._locked, fn, *args
        )

    def _locked(self, fn: Any, *args: Any) -> Any:
        # One connection, two threads (inline writes on the loop in 'normal' mode): a
        # statement never runs inside another thread's transaction.
        with self._lock:
            return fn(*args)

    def writable(self) -> bool:
        return self._writable

    # -- writes ----------------------------------------------------------------------------

    async def commit(self, batch: WriteBatch) -> list[Event]:
        if self._sync == "normal" and not self._writing and self._queue.empty():
            # No fsync to wait for: the write is a few syscalls, cheaper on the loop than
            # the two thread hops of the group-commit writer.
            self._write_now(batch)
            return batch.numbered
        done: asyncio.Future[list[Event]] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((batch, done))
        return await done

    async def _write_loop(self) -> None:
        while True:
            pending = [await self._queue.get()]
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
            first_seq = self._next_seq
            batches = [self._number(batch) for batch, _done in pending]
            self._writing = True
            try:
                await self._run(self._write, batches)
            except Exception as exc:  # any failure fails this batch, never the writer
                self._next_seq = first_seq
                self._fail([done for _b, done in pending], exc)
                continue
            finally:
                self._writing = False
            self._durable(batches)
            for batch, done in pending:
                if not done.done():
                    done.set_result(batch.numbered)

    def _number(self, batch: WriteBatch) -> WriteBatch:
        numbered = []
        for event in batch.events:
            numbered.append(dataclasses.replace(event, seq=self._next_seq, epoch=self.epoch))
            self._next_seq += 1
        batch.numbered = numbered
        return batch

    def _fail(self, futures: Sequence[asyncio.Future[list[Event]]], exc: Exception) -> None:
        if not isinstance(exc, StateError):
            log.error("unexpected error writing the state store: %r", exc)
            exc = StateError(f"cannot write the state store: {exc!r}")
        self._writable = False
        for done in futures:
            if not done.done():
                done.set_exception(exc)

    def _durable(self, batches: Sequence[WriteBatch]) -> None:
        """On the loop, right after the sync: apply, then publish, in commit order."""
        self._writable = True
        self.batches += 1
        for batch in batches:
            if batch.on_durable is not None:
                try:
                    batch.on_durable(batch.numbered)
                except Exception:
                    log.exception("applying a durable change failed")
        events = [e for batch in batches for e in batch.numbered]
        if events:
            self.on_published(events)

    def _write_now(self, batch: WriteBatch) -> None:
        if self._db is None:
            raise StateError("the state store is not open")
        first_seq = self._next_seq
        self._number(batch)
        try:
            self._locked(self._write, [batch])
        except StateError:
            self._next_seq = first_seq
            self._writable = False
            raise
        self._durable([batch])

    def _write(self, batches: Sequence[WriteBatch]) -> None:
        assert self._db is not None
        leases = [lease for b in batches for lease in b.leases]
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(LEASE_INSERT, [lease_row(x) for x in leases])
            self._db.executemany(
                REQUEST_INSERT, [request_row(r) for b in batches for r in b.requests]
            )
            self._db.executemany(EVENT_INSERT, [event_row(e) for b in batches for e in b.numbered])
            self._db.executemany(
                HISTORY_INSERT, [history_row(x) for x in leases if x.state.is_terminal]
            )
            self._db.executemany(
                ALLOCATION_INSERT, [allocation_row(r) for b in batches for r in b.allocations]
            )
            self._db.execute("COMMIT")
        except Exception as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise StateError(f"cannot write the state store {self.path}: {exc}") from exc

    async def prune(self, *, now: float, retention: Retention) -> Pruned:
        def run() -> Pruned:
            assert self._db is not None
            try:
                return self._prune(self._db, now, retention)
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StateError(f"cannot prune the state store: {exc}") from exc

        pruned: Pruned = await self._run(run)
        return pruned

    @staticmethod
    def _prune(db: sqlite3.Connection, now: float, r: Retention) -> Pruned:
        ended = ", ".join("?" * len(ENDED_STATES))
        live = ", ".join("?" * len(LIVE_STATES))
        db.execute("BEGIN IMMEDIATE")
        leases = db.execute(
            f"DELETE FROM leases WHERE state IN ({ended}) AND updated_at < ?",
            (*ENDED_STATES, now - r.ended_s),
        ).rowcount
        requests = db.execute(
            "DELETE FROM requests WHERE at < ? AND lease_id NOT IN "
            f"(SELECT lease_id FROM leases WHERE state IN ({live}))",
            (now - r.ended_s, *LIVE_STATES),
        ).rowcount
        last = int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0])
        events = db.execute(
            "DELETE FROM events WHERE at < ? OR seq <= ?", (now - r.events_s, last - r.max_events)
        ).rowcount
        history = db.execute(
            "DELETE FROM lease_history WHERE lease_id IN (SELECT lease_id FROM lease_history "
            "ORDER BY ended_at DESC LIMIT -1 OFFSET ?)",
            (r.max_history,),
        ).rowcount
        allocations = SqliteStateStore._prune_allocations(db, r.max_deferred)
        db.execute("COMMIT")
        return Pruned(leases, requests, events, history, allocations)

    @staticmethod
    def _prune_allocations(db: sqlite3.Connection, max_deferred: int) -> int:
        """Units deferred to NRI and handed out again since (before the records of ended
        leases go: a deferral must not outlive what replaced it), or beyond the newest
        ``max_deferred``; then the records of leases no longer live (inside the caller's
        transaction)."""
        kind, allocated = ALLOCATION_DEFERRED, ALLOCATION_HANDED
        superseded = db.execute(
            "DELETE FROM allocations WHERE kind = ? AND EXISTS (SELECT 1 FROM allocations "
            "AS later WHERE later.units = allocations.units AND later.seq > allocations.seq "
            "AND later.kind IN (?, ?))",
            (kind, kind, allocated),
        ).rowcount
        beyond = db.execute(
            "DELETE FROM allocations WHERE seq IN (SELECT seq FROM allocations WHERE kind = ? "
            "ORDER BY seq DESC LIMIT -1 OFFSET ?)",
            (kind, max_deferred),
        ).rowcount
        live = ", ".join("?" * len(LIVE_STATES))
        ended = db.execute(
            "DELETE FROM allocations WHERE lease_id != '' AND lease_id NOT IN "
            f"(SELECT lease_id FROM leases WHERE state IN ({live}))",
            LIVE_STATES,
        ).rowcount
        return int(superseded) + int(beyond) + int(ended)

    async def heartbeat(self, *, at: float) -> None:
        await self._small_write("INSERT OR REPLACE INTO heartbeat VALUES (1, ?)", (at,))

    async def set_drained(self, device_uuid: str, reason: str | None, *, at: float) -> None:
        if reason is None:
            await self._small_write("DELETE FROM drained WHERE device_uuid = ?", (device_uuid,))
        else:
            await self._small_write(
                "INSERT OR REPLACE INTO drained VALUES (?, ?, ?)", (device_uuid, reason, at)
            )

    async def add_run_records(
        self, rows: Sequence[RunRecordRow], *, keep: int = RUN_RECORDS_KEPT
    ) -> None:
        """Insert the rows and delete all but the newest ``keep``, in one transaction."""

        def run(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(RUN_RECORD_INSERT, [tuple(r) for r in rows])
            db.execute(RUN_RECORD_TRIM, (keep,))
            db.execute("COMMIT")

        await self._write_with(run)

    async def _small_write(self, sql: str, args: tuple[Any, ...]) -> None:
        await self._write_with(lambda db: db.execute(sql, args))

    async def _write_with(self, step: Callable[[sqlite3.Connection], object]) -> None:
        """A write outside the group commit, on the writer's thread; a failure marks the
        store unwritable (and rolls back a transaction ``step`` began)."""

        def run() -> None:
            assert self._db is not None
            try:
                step(self._db)
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StateError(f"cannot write the state store: {exc}") from exc

        try:
            await self._run(run)
        except StateError:
            self._writable = False
            raise
        self._writable = True

    # -- reads (on the reader's own connection) --------------------------------------------

    async def live_leases(self) -> list[Lease]:
        return await self._reader.live_leases()

    async def lease(self, lease_id: str) -> Lease | None:
        return await self._reader.lease(lease_id)

    async def lease_by_request(self, request_id: str) -> Lease | None:
        return await self._reader.lease_by_request(request_id)

    async def request_record(self, tenant: str, request_id: str) -> RequestRecord | None:
        return await self._reader.request_record(tenant, request_id)

    async def recent_requests(self, *, limit: int) -> list[RequestRecord]:
        return await self._reader.recent_requests(limit=limit)

    async def gang_leases(self, gang_id: str) -> list[Lease]:
        return await self._reader.gang_leases(gang_id)

    async def events_since(self, seq: int, *, limit: int) -> list[Event]:
        return await self._reader.events_since(seq, limit=limit)

    async def first_event_seq(self) -> int:
        return await self._reader.first_event_seq()

    async def last_event_seq(self) -> int:
        return self._next_seq - 1

    async def history(self, *, since: float = 0.0, limit: int = 1_000_000) -> list[HistoryRow]:
        return await self._reader.history(since=since, limit=limit)

    async def allocation_records(self) -> list[AllocationRow]:
        """The legacy device plugin's records (its ``AllocationStore`` port), oldest first."""
        return await self._reader.allocation_records()

    async def drained(self) -> dict[str, str]:
        return await self._reader.drained()

    async def run_records(self, *, limit: int = RUN_RECORDS_KEPT) -> list[RunRecordRow]:
        return await self._reader.run_records(limit=limit)

    async def run_record_count(self) -> int:
        return await self._reader.run_record_count()
