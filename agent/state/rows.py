"""Rows of the SQLite store and the values they hold."""

from __future__ import annotations

import json
from typing import Any

from agent.core.lease import Lease, LeaseState
from agent.core.types import Event, PriorityClass
from agent.state.port import AllocationRow, RequestRecord

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
    "version",
    "owner",
    "workload",
    "pod",
    "run_as_uid",
)
LEASE_SELECT = f"SELECT {', '.join(LEASE_COLUMNS)} FROM leases"
LEASE_INSERT = (
    f"INSERT OR REPLACE INTO leases ({', '.join(LEASE_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(LEASE_COLUMNS))})"
)
EVENT_COLUMNS = "seq, at, kind, message, device_uuid, lease_id, attrs, epoch"
EVENT_INSERT = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
HISTORY_INSERT = (
    "INSERT OR REPLACE INTO lease_history (lease_id, ended_at, final_state, "
    "attributes, became_ready, ready_after_s) VALUES (?, ?, ?, ?, ?, ?)"
)
REQUEST_COLUMNS = "tenant, request_id, fingerprint, canonical, lease_id, at"
REQUEST_INSERT = f"INSERT OR REPLACE INTO requests ({REQUEST_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
ALLOCATION_COLUMNS = "kind, at, lease_id, units, pod"
ALLOCATION_INSERT = f"INSERT INTO allocations ({ALLOCATION_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
# The two kinds of allocation rows the pruner tells apart (the device plugin's records say
# what each kind means): units answered without a lease yet (NRI's marker), and a lease
# handed out (after which the units' deferral is gone).
ALLOCATION_DEFERRED = "deferred"
ALLOCATION_HANDED = "allocated"
RUN_RECORD_INSERT = "INSERT INTO run_records (at, family, record) VALUES (?, ?, ?)"
RUN_RECORD_TRIM = (  # all but the newest ?
    "DELETE FROM run_records WHERE seq IN (SELECT seq FROM run_records ORDER BY seq DESC "
    "LIMIT -1 OFFSET ?)"
)
LIVE_STATES = tuple(s.value for s in LeaseState if s.holds_capacity)
ENDED_STATES = tuple(s.value for s in LeaseState if not s.holds_capacity)


def lease_row(lease: Lease) -> tuple[Any, ...]:
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
        lease.version,
        lease.owner,
        lease.workload,
        lease.pod,
        lease.run_as_uid,
    )


def history_row(lease: Lease) -> tuple[Any, ...]:
    ready_after = lease.ready_at - lease.created_at if lease.ready_at is not None else None
    return (
        lease.lease_id,
        lease.updated_at,
        lease.state.value,
        json.dumps(dict(lease.attributes)),
        int(lease.ready_at is not None),
        ready_after,
    )


def lease_from_row(row: tuple[Any, ...]) -> Lease:
    values = dict(zip(LEASE_COLUMNS, row, strict=True))
    values["priority"] = PriorityClass(values["priority"])
    values["state"] = LeaseState(values["state"])
    values["client_pids"] = tuple(json.loads(values["client_pids"]))
    values["counters"] = json.loads(values["counters"])
    values["attributes"] = json.loads(values["attributes"])
    return Lease(**values)


def event_row(event: Event) -> tuple[Any, ...]:
    return (
        event.seq,
        event.at,
        event.kind,
        event.message,
        event.device_uuid,
        event.lease_id,
        json.dumps(dict(event.attrs)),
        event.epoch,
    )


def event_from_row(r: tuple[Any, ...]) -> Event:
    return Event(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), epoch=r[7])


def request_row(record: RequestRecord) -> tuple[Any, ...]:
    return (
        record.tenant,
        record.request_id,
        record.fingerprint,
        record.canonical,
        record.lease_id,
        record.at,
    )


def request_from_row(r: tuple[Any, ...]) -> RequestRecord:
    return RequestRecord(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), float(r[5]))


def allocation_row(record: AllocationRow) -> tuple[Any, ...]:
    kind, at, lease_id, units, pod = record
    return (str(kind), at, lease_id, json.dumps(sorted(units)), pod)


def allocation_from_row(r: tuple[Any, ...]) -> AllocationRow:
    units = tuple(str(u) for u in json.loads(r[3]))
    return AllocationRow(str(r[0]), float(r[1]), str(r[2]), units, str(r[4]))
