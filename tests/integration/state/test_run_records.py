"""The node's run records on the real store: written and read back in order, bounded to
the newest (also when read in pages), kept by a restart, and a store at schema 9 gains
their table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agent.core.errors import StateError
from agent.state import reader
from agent.state.migrations import MIGRATIONS, schema_version
from agent.state.port import RunRecordRow
from agent.state.sqlite import SqliteStateStore


def rows(first: int, count: int) -> list[RunRecordRow]:
    return [
        RunRecordRow(float(i), f"family-{i % 3}", f'{{"n": {i}}}')
        for i in range(first, first + count)
    ]


async def test_records_round_trip_oldest_first(tmp_path: Path) -> None:
    store = SqliteStateStore(str(tmp_path / "state.db"))
    await store.start()
    try:
        assert await store.run_records() == [] and await store.run_record_count() == 0
        await store.add_run_records(rows(0, 3))
        await store.add_run_records(rows(3, 2))
        assert await store.run_records() == rows(0, 5)
        assert await store.run_records(limit=2) == rows(3, 2)  # the newest two
        assert await store.run_record_count() == 5
    finally:
        await store.aclose()


async def test_only_the_newest_are_kept_and_a_restart_keeps_them(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    store = SqliteStateStore(path)
    await store.start()
    try:
        await store.add_run_records(rows(0, 8), keep=5)
        assert await store.run_records() == rows(3, 5)
        await store.add_run_records(rows(8, 1), keep=5)
        assert await store.run_records() == rows(4, 5)
    finally:
        await store.aclose()
    again = SqliteStateStore(path)
    await again.start()
    try:
        assert await again.run_records() == rows(4, 5)
    finally:
        await again.aclose()


async def test_records_are_read_in_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "MAX_PAGE", 3)
    store = SqliteStateStore(str(tmp_path / "state.db"))
    await store.start()
    try:
        await store.add_run_records(rows(0, 10))
        assert await store.run_records() == rows(0, 10)
        assert await store.run_records(limit=7) == rows(3, 7)
    finally:
        await store.aclose()


async def test_a_failed_write_says_so_and_marks_the_store_unwritable(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStateStore(str(path))
    await store.start()
    try:
        outside = sqlite3.connect(path, isolation_level=None)
        outside.execute("DROP TABLE run_records")  # a write that cannot succeed
        outside.close()
        with pytest.raises(StateError, match="cannot write the state store"):
            await store.add_run_records(rows(0, 1))
        assert not store.writable()
        await store.heartbeat(at=1.0)
        assert store.writable()
    finally:
        await store.aclose()


async def test_a_store_at_schema_9_gains_the_run_records_table(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path, isolation_level=None)
    schema_version(db)
    for version, script in enumerate(MIGRATIONS[:9], start=1):
        db.executescript(f"BEGIN; {script}; INSERT INTO schema_version VALUES ({version}); COMMIT;")
    db.close()
    store = SqliteStateStore(str(path))
    await store.start()
    try:
        await store.add_run_records(rows(0, 1))
        assert await store.run_records() == rows(0, 1)
    finally:
        await store.aclose()
    db = sqlite3.connect(path)
    assert schema_version(db) == len(MIGRATIONS) == 11
    db.close()
