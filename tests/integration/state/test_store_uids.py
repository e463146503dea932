"""A lease's UID on the real store: a store of schema 10 (before UIDs) opens, its leases
load without a UID and keep running, new leases keep theirs across a restart, and the
ledger's per-device UIDs follow admissions, releases and restarts."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.core.lease import Lease, LeaseState
from agent.core.types import PriorityClass, ReasonCode
from agent.core.units import GIB
from agent.node.requests import record_for
from agent.state.migrations import MIGRATIONS, schema_version
from agent.state.rows import LEASE_COLUMNS, REQUEST_INSERT, lease_row, request_row
from tests.integration.state.races import open_node, request

PREVIOUS = 10  # the schema before leases had a UID
OLD = Lease(
    "l-old0000000000000000",
    "r-old",
    "t",
    "a",
    "GPU-0",
    PriorityClass.BURSTABLE,
    10 * GIB,
    10.0,
    LeaseState.READY,
    1.0,
    2.0,
    ready_at=2.0,
)


def as_written_by_schema_10(path: Path) -> None:
    """The store as the release before UIDs left it: its schema, one live lease and its
    request id, written with that schema's columns."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        schema_version(db)
        for version, script in enumerate(MIGRATIONS[:PREVIOUS], start=1):
            db.executescript(
                f"BEGIN; {script}; INSERT INTO schema_version VALUES ({version}); COMMIT;"
            )
        columns = [row[1] for row in db.execute("PRAGMA table_info(leases)")]
        assert (*columns, "run_as_uid") == LEASE_COLUMNS, "the new column comes last"
        marks = ", ".join("?" * len(columns))
        db.execute(
            f"INSERT INTO leases ({', '.join(columns)}) VALUES ({marks})", lease_row(OLD)[:-1]
        )
        old_request = request("r-old", 10)
        db.execute(REQUEST_INSERT, request_row(record_for(old_request, None, OLD.lease_id, 1.0)))
    finally:
        db.close()


async def test_an_upgrade_keeps_the_old_leases_and_new_leases_keep_their_uid(
    tmp_path: Path,
) -> None:
    as_written_by_schema_10(tmp_path / "state.db")
    node, store, _events = await open_node(tmp_path)
    try:
        assert node.leases[OLD.lease_id].run_as_uid is None  # loaded, untouched
        assert node.ledger.users("GPU-0") == frozenset()
        again = await node.admit(request("r-old", 10))  # its request id still answers
        assert again.lease is not None and again.lease.lease_id == OLD.lease_id
        mine = await node.admit(request("r-1000", 10, run_as_uid=1000))
        assert mine.lease is not None and mine.lease.run_as_uid == 1000
        other = await node.admit(request("r-2000", 10, run_as_uid=2000))
        assert other.decision.reason is ReasonCode.USER_CONFLICT
    finally:
        await store.aclose()
    db = sqlite3.connect(tmp_path / "state.db")
    assert schema_version(db) == len(MIGRATIONS) == PREVIOUS + 1
    db.close()

    node, store, _events = await open_node(tmp_path)
    try:
        assert node.leases[mine.lease.lease_id].run_as_uid == 1000  # round-trips
        assert node.leases[OLD.lease_id].run_as_uid is None
        assert node.ledger.users("GPU-0") == {1000}
        stored = await store.lease(mine.lease.lease_id)
        assert stored is not None and stored.run_as_uid == 1000
    finally:
        await store.aclose()


async def test_the_ledgers_uids_follow_admissions_releases_and_restarts(tmp_path: Path) -> None:
    node, store, _events = await open_node(tmp_path)
    try:
        first = (await node.admit(request("a", 10, run_as_uid=1000))).lease
        second = (await node.admit(request("b", 10, run_as_uid=1000))).lease
        unsaid = (await node.admit(request("c", 10))).lease
        assert first is not None and second is not None and unsaid is not None
        assert node.ledger.users("GPU-0") == {1000}
        await node.release(first.lease_id)
        assert node.ledger.users("GPU-0") == {1000}, "one lease of UID 1000 is left"
    finally:
        await store.aclose()
    node, store, _events = await open_node(tmp_path)
    try:
        assert node.ledger.users("GPU-0") == {1000}
        refused = await node.admit(request("d", 10, run_as_uid=2000))
        assert refused.decision.reason is ReasonCode.USER_CONFLICT
        await node.release(second.lease_id)
        assert node.ledger.users("GPU-0") == frozenset()
        joined = await node.admit(request("d", 10, run_as_uid=2000))
        assert joined.decision.admitted, "the lease without a UID does not count"
        assert node.ledger.users("GPU-0") == {2000}
    finally:
        await store.aclose()
