"""Schema migrations, applied in order at start-up; the version lives in the database."""

from __future__ import annotations

import sqlite3

MIGRATIONS: tuple[str, ...] = (
    # 1: leases (with reservations as leases in state 'reserved'), events, lease history
    """
    CREATE TABLE leases (
        lease_id TEXT PRIMARY KEY,
        request_id TEXT NOT NULL UNIQUE,
        gang_id TEXT,
        tenant TEXT NOT NULL,
        trust_domain TEXT NOT NULL,
        device_uuid TEXT NOT NULL,
        priority TEXT NOT NULL,
        memory_bytes INTEGER NOT NULL,
        thread_pct REAL NOT NULL,
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        profile TEXT,
        retention_floor REAL,
        ready_deadline_at REAL,
        expires_at REAL,
        client_pids TEXT NOT NULL DEFAULT '[]',
        reason TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX leases_by_state ON leases (state);
    CREATE INDEX leases_by_gang ON leases (gang_id);
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        device_uuid TEXT,
        lease_id TEXT,
        attrs TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE lease_history (
        lease_id TEXT PRIMARY KEY,
        ended_at REAL NOT NULL,
        final_state TEXT NOT NULL,
        attributes TEXT NOT NULL,
        became_ready INTEGER NOT NULL,
        ready_after_s REAL
    );
    """,
    # 2: devices closed to new leases by an operator
    """
    CREATE TABLE drained (
        device_uuid TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 3: a heartbeat row, written to find out whether the store can write
    """
    CREATE TABLE heartbeat (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL);
    """,
    # 4: a lease's inline solo counters (for the retention gate)
    """
    ALTER TABLE leases ADD COLUMN counters TEXT NOT NULL DEFAULT '{}';
    """,
    # 5: the readiness predictor's admission-time attributes, and when a lease became ready
    """
    ALTER TABLE leases ADD COLUMN attributes TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE leases ADD COLUMN ready_at REAL;
    CREATE INDEX history_by_end ON lease_history (ended_at);
    """,
    # 6: compare-and-set versions; request ids scoped per tenant with a fingerprint of the
    # request (the leases table is rebuilt without its global UNIQUE on request_id); events
    # carry the boot epoch; a key-value table for the epoch; indexes for pruning by time
    """
    CREATE TABLE leases_v6 (
        lease_id TEXT PRIMARY KEY,
        request_id TEXT NOT NULL,
        gang_id TEXT,
        tenant TEXT NOT NULL,
        trust_domain TEXT NOT NULL,
        device_uuid TEXT NOT NULL,
        priority TEXT NOT NULL,
        memory_bytes INTEGER NOT NULL,
        thread_pct REAL NOT NULL,
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        profile TEXT,
        retention_floor REAL,
        ready_deadline_at REAL,
        expires_at REAL,
        client_pids TEXT NOT NULL DEFAULT '[]',
        reason TEXT NOT NULL DEFAULT '',
        counters TEXT NOT NULL DEFAULT '{}',
        attributes TEXT NOT NULL DEFAULT '{}',
        ready_at REAL,
        version INTEGER NOT NULL DEFAULT 1
    );
    INSERT INTO leases_v6 SELECT lease_id, request_id, gang_id, tenant, trust_domain,
        device_uuid, priority, memory_bytes, thread_pct, state, created_at, updated_at,
        profile, retention_floor, ready_deadline_at, expires_at, client_pids, reason,
        counters, attributes, ready_at, 1 FROM leases;
    DROP TABLE leases;
    ALTER TABLE leases_v6 RENAME TO leases;
    CREATE INDEX leases_by_state ON leases (state);
    CREATE INDEX leases_by_gang ON leases (gang_id);
    CREATE INDEX leases_by_request ON leases (request_id);
    CREATE INDEX leases_by_update ON leases (updated_at);
    CREATE TABLE requests (
        tenant TEXT NOT NULL,
        request_id TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        canonical TEXT NOT NULL,
        lease_id TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (tenant, request_id)
    );
    INSERT INTO requests SELECT tenant, request_id, '', '{}', lease_id, created_at FROM leases;
    CREATE INDEX requests_by_at ON requests (at);
    ALTER TABLE events ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX events_by_at ON events (at);
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 7: who made a lease (its caller identity) and the workload it is granted for
    """
    ALTER TABLE leases ADD COLUMN owner TEXT NOT NULL DEFAULT '';
    ALTER TABLE leases ADD COLUMN workload TEXT NOT NULL DEFAULT '';
    """,
    # 8: the Kubernetes pod a lease is for ("<namespace>/<name>")
    """
    ALTER TABLE leases ADD COLUMN pod TEXT NOT NULL DEFAULT '';
    """,
    # 9: the kubelet device plugin's allocations, in the order they happened: which lease
    # went to which share units (JSON list), a pod lease granted again to its binder, the
    # pod found holding the units (agent.legacy.deviceplugin.podalloc)
    """
    CREATE TABLE allocations (
        seq INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        at REAL NOT NULL,
        lease_id TEXT NOT NULL DEFAULT '',
        units TEXT NOT NULL DEFAULT '[]',
        pod TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX allocations_by_lease ON allocations (lease_id);
    CREATE INDEX allocations_by_units ON allocations (units);
    """,
    # 10: the node's own run records for the retention estimator, one JSON line each (see
    # agent.estimator.records.to_json), with the target's family and when it was made
    """
    CREATE TABLE run_records (
        seq INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        family TEXT NOT NULL,
        record TEXT NOT NULL
    );
    """,
    # 11: the UID a lease's processes run as (one MPS server per UID); NULL: not said, and
    # every lease made before, which keeps running untouched
    """
    ALTER TABLE leases ADD COLUMN run_as_uid INTEGER;
    """,
)


def schema_version(db: sqlite3.Connection) -> int:
    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(db: sqlite3.Connection) -> int:
    """Apply what is missing; returns the version the database is at."""
    current = schema_version(db)
    if current > len(MIGRATIONS):
        raise sqlite3.DatabaseError(
            f"the database is at schema {current}, newer than this agent ({len(MIGRATIONS)})"
        )
    for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
        db.executescript(f"BEGIN; {script}; INSERT INTO schema_version VALUES ({version}); COMMIT;")
    return len(MIGRATIONS)
