"""SQLite store in WAL mode, with group commit.

Every ``commit`` is queued; one writer task takes whatever has queued up, writes it all in
one transaction on the store's own thread and syncs once (``synchronous=FULL``), then wakes
every caller. So concurrent admissions share a sync, and no caller hears back before its
rows are on disk. A failed write fails every caller of that batch with
:class:`StateError` and marks the store unwritable until a write succeeds again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent.core.errors import StateError
from agent.core.lease import Lease, LeaseState
from agent.core.types import Event, HistoryRow, PriorityClass
from agent.state.migrations import migrate

log = logging.getLogger(__name__)

LEASE_COLUMNS = (
    "lease_id",
    "request_id",
    "gang_id",
    "tenant",
    "trust_domain",
    "device_uuid",
    "priority",
    "memory_bytes",
    "thread_pct",
    "state",
    "created_at",
    "updated_at",
    "profile",
    "retention_floor",
    "ready_deadline_at",
    "expires_at",
    "client_pids",
    "reason",
    "counters",
    "attributes",
    "ready_at",
)
LIVE_STATES = tuple(s.value for s in LeaseState if s.holds_capacity)


class SqliteStateStore:
    def __init__(self, path: str, *, sync: str = "full", max_events: int = 100_000) -> None:
        if sync not in ("full", "normal"):
            raise StateError(f"unknown sync mode {sync!r}")
        self.path = path
        self._sync = sync
        self._max_events = max_events
        self._db: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._queue: asyncio.Queue[tuple[list[Lease], list[Event], asyncio.Future[None]]] = (
            asyncio.Queue()
        )
        self._writer: asyncio.Task[None] | None = None
        self._writable = True
        self._lock = threading.Lock()
        self.batches = 0

    # -- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        await self._run(self._open)
        self._writer = asyncio.create_task(self._write_loop(), name="state-writer")

    def _open(self) -> None:
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={self._sync.upper()}")
            db.execute("PRAGMA busy_timeout=5000")
            migrate(db)
        except (sqlite3.Error, OSError) as exc:
            raise StateError(f"cannot open the state store {self.path}: {exc}") from exc
        self._db = db

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None
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

    async def commit(self, leases: Sequence[Lease], events: Sequence[Event]) -> None:
        if self._sync == "normal":
            # No fsync to wait for: the write is a few syscalls, cheaper on the loop than
            # the two thread hops of the group-commit writer.
            self._write_now(list(leases), list(events))
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put((list(leases), list(events), done))
        await done

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            leases = [lease for item in batch for lease in item[0]]
            events = [event for item in batch for event in item[1]]
            try:
                await self._run(self._write, leases, events)
            except Exception as exc:  # any failure fails this batch, never the writer
                if not isinstance(exc, StateError):
                    log.exception("unexpected error writing the state store")
                    exc = StateError(f"cannot write the state store: {exc!r}")
                self._writable = False
                for *_rows, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            self._writable = True
            self.batches += 1
            for *_rows, done in batch:
                if not done.done():
                    done.set_result(None)

    def _write_now(self, leases: list[Lease], events: list[Event]) -> None:
        if self._db is None:
            raise StateError("the state store is not open")
        try:
            self._locked(self._write, leases, events)
        except StateError:
            self._writable = False
            raise
        self._writable = True
        self.batches += 1

    def _write(self, leases: list[Lease], events: list[Event]) -> None:
        assert self._db is not None
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                f"INSERT OR REPLACE INTO leases ({', '.join(LEASE_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(LEASE_COLUMNS))})",
                [_lease_row(lease) for lease in leases],
            )
            self._db.executemany(
                "INSERT INTO events (seq, at, kind, message, device_uuid, lease_id, attrs) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [_event_row(event) for event in events],
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO lease_history (lease_id, ended_at, final_state, "
                "attributes, became_ready, ready_after_s) VALUES (?, ?, ?, ?, ?, ?)",
                [_history_row(lease) for lease in leases if lease.state.is_terminal],
            )
            if events and events[-1].seq % 1000 == 0:
                self._db.execute(
                    "DELETE FROM events WHERE seq <= ?", (events[-1].seq - self._max_events,)
                )
            self._db.execute("COMMIT")
        except Exception as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise StateError(f"cannot write the state store {self.path}: {exc}") from exc

    # -- reads -----------------------------------------------------------------------------

    async def live_leases(self) -> list[Lease]:
        marks = ", ".join("?" * len(LIVE_STATES))
        rows = await self._query(f"SELECT * FROM leases WHERE state IN ({marks})", LIVE_STATES)
        return [_lease(row) for row in rows]

    async def lease_by_request(self, request_id: str) -> Lease | None:
        rows = await self._query("SELECT * FROM leases WHERE request_id = ?", (request_id,))
        return _lease(rows[0]) if rows else None

    async def request_index(self) -> dict[str, str]:
        rows = await self._query("SELECT request_id, lease_id FROM leases", ())
        return {str(r[0]): str(r[1]) for r in rows}

    async def events_since(self, seq: int, *, limit: int) -> list[Event]:
        rows = await self._query(
            "SELECT seq, at, kind, message, device_uuid, lease_id, attrs FROM events "
            "WHERE seq > ? ORDER BY seq LIMIT ?",
            (seq, limit),
        )
        return [Event(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6])) for r in rows]

    async def last_event_seq(self) -> int:
        rows = await self._query("SELECT COALESCE(MAX(seq), 0) FROM events", ())
        return int(rows[0][0])

    async def heartbeat(self, *, at: float) -> None:
        def run() -> None:
            assert self._db is not None
            try:
                self._db.execute("INSERT OR REPLACE INTO heartbeat VALUES (1, ?)", (at,))
            except sqlite3.Error as exc:
                raise StateError(f"cannot write the state store: {exc}") from exc

        try:
            await self._run(run)
        except StateError:
            self._writable = False
            raise
        self._writable = True

    async def set_drained(self, device_uuid: str, reason: str | None, *, at: float) -> None:
        def run() -> None:
            assert self._db is not None
            try:
                if reason is None:
                    self._db.execute("DELETE FROM drained WHERE device_uuid = ?", (device_uuid,))
                else:
                    self._db.execute(
                        "INSERT OR REPLACE INTO drained VALUES (?, ?, ?)", (device_uuid, reason, at)
                    )
            except sqlite3.Error as exc:
                raise StateError(f"cannot write the state store: {exc}") from exc

        await self._run(run)

    async def history(self, *, since: float = 0.0, limit: int = 1_000_000) -> list[HistoryRow]:
        rows = await self._query(
            "SELECT lease_id, ended_at, final_state, attributes, became_ready, ready_after_s "
            "FROM lease_history WHERE ended_at >= ? ORDER BY ended_at LIMIT ?",
            (since, limit),
        )
        return [
            HistoryRow(str(r[0]), r[1], str(r[2]), json.loads(r[3]), bool(r[4]), r[5]) for r in rows
        ]

    async def drained(self) -> dict[str, str]:
        rows = await self._query("SELECT device_uuid, reason FROM drained", ())
        return {str(r[0]): str(r[1]) for r in rows}

    async def _query(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        def run() -> list[tuple[Any, ...]]:
            assert self._db is not None
            try:
                return list(self._db.execute(sql, tuple(args)).fetchall())
            except sqlite3.Error as exc:
                raise StateError(f"cannot read the state store: {exc}") from exc

        result: list[tuple[Any, ...]] = await self._run(run)
        return result


def _lease_row(lease: Lease) -> tuple[Any, ...]:
    return (
        lease.lease_id,
        lease.request_id,
        lease.gang_id,
        lease.tenant,
        lease.trust_domain,
        lease.device_uuid,
        lease.priority.value,
        lease.memory_bytes,
        lease.thread_pct,
        lease.state.value,
        lease.created_at,
        lease.updated_at,
        lease.profile,
        lease.retention_floor,
        lease.ready_deadline_at,
        lease.expires_at,
        json.dumps(list(lease.client_pids)),
        lease.reason,
        json.dumps(dict(lease.counters)),
        json.dumps(dict(lease.attributes)),
        lease.ready_at,
    )


def _history_row(lease: Lease) -> tuple[Any, ...]:
    ready_after = lease.ready_at - lease.created_at if lease.ready_at is not None else None
    return (
        lease.lease_id,
        lease.updated_at,
        lease.state.value,
        json.dumps(dict(lease.attributes)),
        int(lease.ready_at is not None),
        ready_after,
    )


def _lease(row: tuple[Any, ...]) -> Lease:
    values = dict(zip(LEASE_COLUMNS, row, strict=True))
    values["priority"] = PriorityClass(values["priority"])
    values["state"] = LeaseState(values["state"])
    values["client_pids"] = tuple(json.loads(values["client_pids"]))
    values["counters"] = json.loads(values["counters"])
    values["attributes"] = json.loads(values["attributes"])
    return Lease(**values)


def _event_row(event: Event) -> tuple[Any, ...]:
    return (
        event.seq,
        event.at,
        event.kind,
        event.message,
        event.device_uuid,
        event.lease_id,
        json.dumps(dict(event.attrs)),
    )
