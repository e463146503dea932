"""Port of the state domain: the durable store of leases, request ids, events and run
records (and the rows of the legacy device plugin's allocations, whose meaning its own
package keeps: ``agent.legacy.deviceplugin.records``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from agent.core.learning import HistoryRow
from agent.core.lease import Lease
from agent.core.types import Event


class RequestRecord(NamedTuple):
    """A request id as the scheduler sent it: scoped by tenant, with a fingerprint of the
    canonical request, so the same id with another request can be told apart. A tuple of
    plain values: the garbage collector stops tracking it, and the agent keeps 100,000."""

    tenant: str
    request_id: str
    fingerprint: str
    canonical: str  # the canonical request, JSON
    lease_id: str
    at: float


class AllocationRow(NamedTuple):
    """A row of the ``allocations`` table, in the order they happened. The legacy device
    plugin writes and reads them through a port of its own (``AllocationStore``, which
    the SQLite store implements) and keeps what they mean
    (``agent.legacy.deviceplugin.records``); the store keeps them with their lease and,
    of their kinds, knows only the two its pruner needs (see :mod:`agent.state.rows`)."""

    kind: str
    at: float
    lease_id: str = ""
    units: tuple[str, ...] = ()
    pod: str = ""


class RunRecordRow(NamedTuple):
    """One run record of the node's own workloads, as stored: when it was made, the family
    of its target workload, and the record as one JSON line (the retention estimator's)."""

    at: float
    family: str
    record: str


RUN_RECORDS_KEPT = 20_000  # the newest run records kept; older ones are deleted as new come


@dataclass(slots=True)
class WriteBatch:
    """One caller's part of a group commit.

    ``events`` are drafts (``seq`` 0): the store numbers them densely in commit order.
    ``on_durable`` runs on the event loop once the batch is on disk, before its events are
    published and before the caller hears back; it is how the ledger applies a change
    exactly when it becomes true. A failed write runs nothing and numbers nothing.
    ``allocations`` are rows of the legacy device plugin's records, written in the same
    transaction.
    """

    leases: Sequence[Lease] = ()
    events: Sequence[Event] = ()
    requests: Sequence[RequestRecord] = ()
    on_durable: Callable[[Sequence[Event]], None] | None = None
    allocations: Sequence[AllocationRow] = ()
    numbered: list[Event] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Retention:
    """How long ended things are kept: ended leases with their request ids, events (by age
    and count), and rows of lease history (by count). Allocation records go with their
    lease; of units deferred to the NRI plugin, the last record of each set of units is
    kept until they are handed out again (``max_deferred`` at most)."""

    ended_s: float = 7 * 86400.0
    events_s: float = 7 * 86400.0
    max_events: int = 100_000
    max_history: int = 1_000_000
    max_deferred: int = 10_000


@dataclass(frozen=True, slots=True)
class Pruned:
    leases: int = 0
    requests: int = 0
    events: int = 0
    history: int = 0
    allocations: int = 0


class StateStore(Protocol):
    """Leases, request ids and events on disk. ``commit`` returns once
    they are durable (fsync'd); concurrent commits share one sync (group commit). Reads
    that can be large (event catch-up, lookups of old ids) use a connection of their own,
    never the writer's thread."""

    epoch: int  # this start's boot epoch (after ``start``)
    on_published: Callable[[Sequence[Event]], None]  # every durable batch's events, in order

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def commit(self, batch: WriteBatch) -> list[Event]: ...

    async def live_leases(self) -> list[Lease]: ...

    async def lease(self, lease_id: str) -> Lease | None: ...

    async def request_record(self, tenant: str, request_id: str) -> RequestRecord | None: ...

    async def recent_requests(self, *, limit: int) -> list[RequestRecord]:
        """The newest request ids, oldest first."""
        ...

    async def gang_leases(self, gang_id: str) -> list[Lease]: ...

    async def events_since(self, seq: int, *, limit: int) -> list[Event]: ...

    async def first_event_seq(self) -> int: ...

    async def last_event_seq(self) -> int: ...

    async def set_drained(self, device_uuid: str, reason: str | None, *, at: float) -> None: ...

    async def drained(self) -> dict[str, str]: ...

    async def history(self, *, since: float = 0.0, limit: int = 1_000_000) -> list[HistoryRow]:
        """Leases that ended (oldest first): the readiness predictor's training rows."""
        ...

    async def prune(self, *, now: float, retention: Retention) -> Pruned:
        """Delete what the retention no longer keeps (never a live lease or its id)."""
        ...

    async def add_run_records(
        self, rows: Sequence[RunRecordRow], *, keep: int = RUN_RECORDS_KEPT
    ) -> None:
        """Store run records durably, keeping only the newest ``keep`` (one transaction)."""
        ...

    async def run_records(self, *, limit: int = RUN_RECORDS_KEPT) -> list[RunRecordRow]:
        """The newest ``limit`` run records, oldest first (read in pages)."""
        ...

    async def run_record_count(self) -> int: ...

    async def heartbeat(self, *, at: float) -> None:
        """A tiny durable write: proves (or disproves) that the store can write."""
        ...

    def writable(self) -> bool: ...
