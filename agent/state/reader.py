"""Reads of the SQLite store on a connection and a thread of their own.

WAL lets a reader see the last committed state while the writer writes, so a watcher that
catches up over a hundred thousand events, or a look-up of an old request id, never waits
behind lease writes, and lease writes never wait behind it. Every read is paged or by key.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agent.core.errors import StateError
from agent.core.learning import HistoryRow
from agent.core.lease import Lease
from agent.core.types import Event
from agent.state.port import AllocationRow, RequestRecord, RunRecordRow
from agent.state.rows import (
    ALLOCATION_COLUMNS,
    EVENT_COLUMNS,
    LEASE_SELECT,
    LIVE_STATES,
    REQUEST_COLUMNS,
    allocation_from_row,
    event_from_row,
    lease_from_row,
    request_from_row,
)

T = TypeVar("T")
R = TypeVar("R")
MAX_PAGE = 10_000


class SqliteReader:
    def __init__(self, path: str) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._shared = False
        self._executor: ThreadPoolExecutor | None = None

    async def start(self, *, shared: sqlite3.Connection | None = None) -> None:
        """Open a connection of its own; ``shared``: use the writer's (``:memory:``, where a
        second connection would see another database)."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-read")
        if shared is not None:
            self._db, self._shared = shared, True
            return
        await self._run(self._open)

    def _open(self) -> None:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA query_only=ON")
            db.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error as exc:
            raise StateError(f"cannot open the state store {self.path} to read: {exc}") from exc
        self._db = db

    async def aclose(self) -> None:
        if self._executor is None:
            return
        if self._db is not None and not self._shared:
            await self._run(self._db.close)
        self._executor.shutdown(wait=True)
        self._executor = None
        self._db = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StateError("the state store is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def query(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        return await self.rows(sql, args, lambda row: row)

    async def rows(
        self, sql: str, args: Sequence[Any], convert: Callable[[tuple[Any, ...]], R]
    ) -> list[R]:
        """The rows of a query, each converted in the reader's thread (a page of events
        parsed on the event loop would hold up the admissions)."""

        def run() -> list[R]:
            assert self._db is not None
            try:
                return [convert(row) for row in self._db.execute(sql, tuple(args)).fetchall()]
            except sqlite3.Error as exc:
                raise StateError(f"cannot read the state store: {exc}") from exc

        return await self._run(run)

    # -- what the store answers from this connection ---------------------------------------

    async def events_since(self, seq: int, *, limit: int) -> list[Event]:
        return await self.rows(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (seq, min(limit, MAX_PAGE)),
            event_from_row,
        )

    async def first_event_seq(self) -> int:
        rows = await self.query("SELECT COALESCE(MIN(seq), 0) FROM events", ())
        return int(rows[0][0])

    async def lease(self, lease_id: str) -> Lease | None:
        rows = await self.query(f"{LEASE_SELECT} WHERE lease_id = ?", (lease_id,))
        return lease_from_row(rows[0]) if rows else None

    async def lease_by_request(self, request_id: str) -> Lease | None:
        rows = await self.query(f"{LEASE_SELECT} WHERE request_id = ? LIMIT 1", (request_id,))
        return lease_from_row(rows[0]) if rows else None

    async def request_record(self, tenant: str, request_id: str) -> RequestRecord | None:
        rows = await self.query(
            f"SELECT {REQUEST_COLUMNS} FROM requests WHERE tenant = ? AND request_id = ?",
            (tenant, request_id),
        )
        return request_from_row(rows[0]) if rows else None

    async def recent_requests(self, *, limit: int) -> list[RequestRecord]:
        rows = await self.query(
            f"SELECT {REQUEST_COLUMNS} FROM requests ORDER BY at DESC LIMIT ?", (limit,)
        )
        return [request_from_row(r) for r in rows][::-1]

    async def gang_leases(self, gang_id: str) -> list[Lease]:
        return await self.rows(
            f"{LEASE_SELECT} WHERE gang_id = ? LIMIT ?", (gang_id, MAX_PAGE), lease_from_row
        )

    async def live_leases(self) -> list[Lease]:
        marks = ", ".join("?" * len(LIVE_STATES))
        return await self.rows(
            f"{LEASE_SELECT} WHERE state IN ({marks})", LIVE_STATES, lease_from_row
        )

    async def allocation_records(self) -> list[AllocationRow]:
        """Every allocation record, oldest first, a page at a time (the table holds the
        records of live leases, and the last deferral of units to NRI)."""
        records: list[AllocationRow] = []
        last = 0
        while True:
            rows = await self.query(
                f"SELECT seq, {ALLOCATION_COLUMNS} FROM allocations WHERE seq > ? "
                "ORDER BY seq LIMIT ?",
                (last, MAX_PAGE),
            )
            records.extend(allocation_from_row(r[1:]) for r in rows)
            if len(rows) < MAX_PAGE:
                return records
            last = int(rows[-1][0])

    async def history(self, *, since: float, limit: int) -> list[HistoryRow]:
        rows = await self.query(
            "SELECT lease_id, ended_at, final_state, attributes, became_ready, ready_after_s "
            "FROM lease_history WHERE ended_at >= ? ORDER BY ended_at LIMIT ?",
            (since, limit),
        )
        return [
            HistoryRow(str(r[0]), r[1], str(r[2]), json.loads(r[3]), bool(r[4]), r[5]) for r in rows
        ]

    async def drained(self) -> dict[str, str]:
        rows = await self.query("SELECT device_uuid, reason FROM drained", ())
        return {str(r[0]): str(r[1]) for r in rows}

    async def run_records(self, *, limit: int) -> list[RunRecordRow]:
        """The newest ``limit`` run records, oldest first, a page at a time."""
        rows: list[RunRecordRow] = []
        last = await self._first_run_record(limit) - 1
        while len(rows) < limit:
            page = await self.query(
                "SELECT seq, at, family, record FROM run_records WHERE seq > ? ORDER BY seq "
                "LIMIT ?",
                (last, min(MAX_PAGE, limit - len(rows))),
            )
            rows.extend(RunRecordRow(float(r[1]), str(r[2]), str(r[3])) for r in page)
            if not page:
                return rows
            last = int(page[-1][0])
        return rows

    async def _first_run_record(self, limit: int) -> int:
        """The seq of the oldest of the newest ``limit`` run records (0 when none)."""
        found = await self.query(
            "SELECT MIN(seq) FROM (SELECT seq FROM run_records ORDER BY seq DESC LIMIT ?)",
            (limit,),
        )
        return int(found[0][0] or 0)

    async def run_record_count(self) -> int:
        rows = await self.query("SELECT COUNT(*) FROM run_records", ())
        return int(rows[0][0])
