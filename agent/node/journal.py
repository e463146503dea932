"""How the ledger's changes reach the disk: one store commit per decision, the ledger
applied in the same loop step that makes the change durable (with whatever else must
become true with it: ``then``), the leases concerned held busy until the write settles,
and exactly what was taken undone if it fails. Events that explain a change (``notes``)
travel in the same commit, before the leases' own events: a failed write tells nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from agent.core.lease import Lease
from agent.core.types import Decision, Event
from agent.node.events import EventLog
from agent.node.ledger import Ledger
from agent.state.port import RequestRecord, StateStore, WriteBatch

Write = asyncio.Future[list[Event]]


class Journal:
    def __init__(self, ledger: Ledger, store: StateStore, events: EventLog) -> None:
        self._ledger = ledger
        self._store = store
        self._events = events

    def write(
        self,
        leases: Sequence[Lease],
        *,
        requests: Sequence[RequestRecord] = (),
        apply: bool = True,
        undo: Callable[[], None] | None = None,
        decision: Decision | None = None,
        notes: Sequence[Event] = (),
        then: Callable[[], None] | None = None,
    ) -> Write:
        """Start the write of ``leases`` (each with its event, after ``notes``). ``apply``:
        install them in the ledger once durable (changes of existing leases, and preempting
        admissions); otherwise they were taken already and ``undo`` gives them back on
        failure. ``then`` runs once durable, right after the ledger changed."""
        changes = list(leases)

        def durable(_events: Sequence[Event]) -> None:
            if apply:
                self._ledger.apply(changes)
            for record in requests:
                self._ledger.remember_request(record)
            if then is not None:
                then()

        batch = WriteBatch(
            changes,
            [*notes, *(self.lease_event(x, decision) for x in changes)],
            requests,
            durable,
        )
        write: Write = asyncio.ensure_future(self._store.commit(batch))
        ids = [x.lease_id for x in changes]
        self._ledger.hold(ids, write)  # type: ignore[arg-type]

        def settled(done: Write) -> None:
            self._ledger.free(ids, done)  # type: ignore[arg-type]
            failed = done.cancelled() or done.exception() is not None
            if failed and undo is not None:
                undo()

        write.add_done_callback(settled)
        return write

    def lease_event(self, lease: Lease, decision: Decision | None = None) -> Event:
        message = f"lease {lease.lease_id} {lease.state.value} on {lease.device_uuid}"
        if lease.reason:
            message += f": {lease.reason}"
        elif decision is not None and decision.message:
            message += f" ({decision.message})"
        return self._events.draft(
            f"lease.{lease.state.value}",
            message,
            device_uuid=lease.device_uuid,
            lease_id=lease.lease_id,
            attrs={
                "tenant": lease.tenant,
                "request_id": lease.request_id,
                "owner": lease.owner,
                "memory_bytes": str(lease.memory_bytes),
                "thread_pct": f"{lease.thread_pct:g}",
                "version": str(lease.version),
            },
        )
