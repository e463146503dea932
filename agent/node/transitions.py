"""Lease transitions after admission: release, gang commit and abort, expiry, readiness,
and the control loops' endings.

Each is decided under the ledger lock from the ledger's current copy (never the caller's),
once no lease it touches has a write in flight; it is written outside the lock and applied
when durable, so capacity is given back only once the freeing write is on disk and a failed
write has changed nothing. A transition that no longer applies answers cleanly
(``ConflictError`` or ``NotFoundError`` naming the lease and its state). Release, Commit
and Abort are idempotent: asking again for what is done answers the same. With an
``owner`` they act only on leases that owner made (a lease's owner never changes, so the
check needs no lock); ``owner=None`` is the node itself or the on-call engineer.

A caller that goes away (its deadline, a cancelled task) at any ``await`` leaves a
consistent ledger: before the decision nothing happened; once decided, the write goes on
and is applied when durable, with everything that must become true with it (a gang's
outcome) applied in that same step rather than after the caller's ``await``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence

from agent.aio.section import LedgerLock
from agent.core.errors import (
    ConflictError,
    GpushareError,
    NotFoundError,
    PermissionDeniedError,
    StateError,
)
from agent.core.lease import ALLOWED_TRANSITIONS, Lease, LeaseState, transition
from agent.core.types import Event
from agent.node.journal import Journal, Write
from agent.node.ledger import GangEnd, Ledger
from agent.state.port import StateStore

log = logging.getLogger(__name__)
Plan = Callable[[], list[Lease]]
Notes = Callable[[list[Lease]], list[Event]]  # events that explain a change, drafted


class Transitions:
    def __init__(
        self,
        *,
        ledger: Ledger,
        journal: Journal,
        store: StateStore,
        lock: LedgerLock,
        clock: Callable[[], float],
    ) -> None:
        self._ledger = ledger
        self._journal = journal
        self._store = store
        self._lock = lock
        self._clock = clock

    async def _run(
        self,
        ids: Callable[[], Sequence[str]],
        plan: Plan,
        *,
        notes: Notes | None = None,
        then: Callable[[], None] | None = None,
    ) -> list[Lease]:
        """Under the lock, once none of ``ids()`` is busy: ``plan`` computes the changes
        from the ledger as it is; they are written (after ``notes`` of them), and applied
        once durable, with ``then``. A cancelled caller leaves the write to finish."""
        while True:
            async with self._lock.held():
                waits = self._ledger.busy(ids())
                if not waits:
                    moved = plan()
                    if not moved:
                        return []
                    drafted = notes(moved) if notes is not None else []
                    write: Write = self._journal.write(moved, notes=drafted, then=then)
                    break
            await asyncio.wait(waits)
        await asyncio.shield(write)
        return moved

    def _moves(self, ids: Sequence[str], target: LeaseState, reason: str) -> list[Lease]:
        now = self._clock()
        live = [self._ledger.live.get(i) for i in ids]
        return [
            transition(x, target, at=now, reason=reason)
            for x in live
            if x is not None and target in ALLOWED_TRANSITIONS[x.state]
        ]

    # -- the control loops' endings ---------------------------------------------------------

    async def end_leases(
        self,
        lease_ids: Sequence[str],
        target: LeaseState,
        reason: str,
        *,
        notes: Notes | None = None,
    ) -> list[Lease]:
        """End those of ``lease_ids`` still live (released, failed, evicted); ones that
        ended meanwhile are left as they are. ``notes`` drafts the events that explain the
        ends, written with them."""
        return await self._run(
            lambda: lease_ids, lambda: self._moves(lease_ids, target, reason), notes=notes
        )

    async def mark_ready(self, lease: Lease, client_pids: list[int]) -> Lease | None:
        """A client of the lease appeared on its device. Refused (None) if the lease moved
        since ``lease`` was read."""

        def plan() -> list[Lease]:
            current = self._ledger.live.get(lease.lease_id)
            if current is None or current.version != lease.version:
                return []
            if current.state is not LeaseState.ADMITTED:
                return []
            ready = transition(
                current,
                LeaseState.READY,
                at=self._clock(),
                reason=f"client {client_pids[0]} connected",
            )
            return [dataclasses.replace(ready, client_pids=tuple(client_pids))]

        moved = await self._run(lambda: [lease.lease_id], plan)
        return moved[0] if moved else None

    async def mark_ineffective(self, lease: Lease) -> Lease | None:
        """Never ready by its deadline: the lease ends and its capacity is freed. Refused
        (None) if the lease moved since ``lease`` was read."""

        def plan() -> list[Lease]:
            current = self._ledger.live.get(lease.lease_id)
            if current is None or current.version != lease.version:
                return []
            reason = "no client appeared before the readiness deadline"
            return self._moves([lease.lease_id], LeaseState.INEFFECTIVE, reason)

        moved = await self._run(lambda: [lease.lease_id], plan)
        return moved[0] if moved else None

    # -- the scheduler's calls --------------------------------------------------------------

    async def release(self, lease_id: str, *, owner: str | None = None) -> Lease:
        if owner is not None:
            found = self._ledger.get(lease_id) or await self._store.lease(lease_id)
            _check_owner([found] if found else [], owner, f"lease {lease_id}")
        moved = await self._run(
            lambda: [lease_id],
            lambda: self._moves([lease_id], LeaseState.RELEASED, "released by the caller"),
        )
        if moved:
            return moved[0]
        lease = self._ledger.get(lease_id) or await self._store.lease(lease_id)
        if lease is None:
            raise NotFoundError(f"no lease {lease_id!r} on this node")
        if lease.state is LeaseState.RELEASED:
            return lease  # released before: answer the same
        raise ConflictError(f"lease {lease_id} is {lease.state.value}: nothing to release")

    def _gang_ids(self, gang_id: str) -> Callable[[], list[str]]:
        return lambda: [x.lease_id for x in self._ledger.gang(gang_id)]

    async def _check_gang_owner(self, gang_id: str, owner: str | None) -> None:
        if owner is None:
            return
        members = self._ledger.gang(gang_id) or self._ledger.ended_gang(gang_id)
        if not members:
            members = await self._store.gang_leases(gang_id)
        _check_owner(members, owner, f"gang {gang_id!r}")

    async def commit(self, gang_id: str, *, owner: str | None = None) -> list[Lease]:
        """All reserved members become admitted in one write, or none: one decision under
        the lock, from the ledger as it is once no member's write is in flight. A member
        that ended while reserved in this round of the gang (expired by the reaper
        meanwhile, released) or whose TTL has passed makes the commit expire the others and
        answer which. With no member reserved, a gang committed before answers its
        members."""
        await self._check_gang_owner(gang_id, owner)
        refused: list[GangEnd] = []

        def plan() -> list[Lease]:
            reserved = [x for x in self._ledger.gang(gang_id) if x.state is LeaseState.RESERVED]
            ids = [x.lease_id for x in reserved]
            end = self._ledger.uncommittable(gang_id) or self._overdue(reserved)
            if end is not None:
                refused.append(end)
                return self._moves(ids, LeaseState.EXPIRED, end.why(gang_id))
            return self._moves(ids, LeaseState.ADMITTED, f"gang {gang_id} committed")

        def committed() -> None:
            if not refused:
                self._ledger.remember_gang(gang_id, "committed")

        moved = await self._run(self._gang_ids(gang_id), plan, then=committed)
        if refused:
            raise ConflictError(refused[0].why(gang_id))
        if moved:
            return moved
        members = self._ledger.gang(gang_id)
        if members:
            return members  # committed before: answer the same
        return await self._ended_gang(gang_id, asked="commit")

    def _overdue(self, reserved: Sequence[Lease]) -> GangEnd | None:
        now = self._clock()
        due = [x for x in reserved if x.expires_at is not None and x.expires_at <= now]
        return GangEnd("expired", f"member {due[0].lease_id} passed its TTL") if due else None

    async def abort(self, gang_id: str, *, owner: str | None = None) -> list[Lease]:
        await self._check_gang_owner(gang_id, owner)

        def plan() -> list[Lease]:
            members = self._ledger.gang(gang_id)
            ids = [x.lease_id for x in members if x.state is LeaseState.RESERVED]
            if members and not ids:
                return []
            return self._moves(ids, LeaseState.RELEASED, f"gang {gang_id} aborted")

        def aborted() -> None:
            self._ledger.remember_gang(gang_id, "aborted")

        moved = await self._run(self._gang_ids(gang_id), plan, then=aborted)
        if moved:
            return moved
        if self._ledger.gang(gang_id):
            raise ConflictError(
                f"gang {gang_id!r} is committed: release its leases instead of aborting"
            )
        return await self._ended_gang(gang_id, asked="abort")

    async def _ended_gang(self, gang_id: str, *, asked: str) -> list[Lease]:
        """A gang with no live member: what became of it (memory first, then the store)."""
        known = self._ledger.gangs.get(gang_id)
        outcome = known.outcome if known is not None else None
        ended = self._ledger.ended_gang(gang_id) or await self._store.gang_leases(gang_id)
        if outcome is None and ended:
            outcome = _outcome(ended)
        if outcome is None:
            raise NotFoundError(f"no reservation held for gang {gang_id!r}")
        if asked == "abort" and outcome == "aborted":
            return ended  # aborted before: answer the same
        if outcome in ("expired", "broken"):
            raise ConflictError((known or GangEnd(outcome)).why(gang_id))
        raise ConflictError(f"gang {gang_id!r} was {outcome}: nothing to {asked}")

    # -- reservations ----------------------------------------------------------------------

    def due(self) -> list[Lease]:
        now = self._clock()
        return [
            x
            for x in self._ledger.live.values()
            if x.state is LeaseState.RESERVED and x.expires_at is not None and x.expires_at <= now
        ]

    async def expire_reservations(self) -> list[Lease]:
        due = [x.lease_id for x in self.due()]
        if not due:
            return []

        def plan() -> list[Lease]:
            now = self._clock()
            still = [
                x.lease_id
                for x in (self._ledger.live.get(i) for i in due)
                if x is not None
                and x.state is LeaseState.RESERVED
                and x.expires_at is not None
                and x.expires_at <= now
            ]
            return self._moves(still, LeaseState.EXPIRED, "reservation TTL passed")

        return await self._run(lambda: due, plan)

    async def reaper_round(self, *, heartbeat: bool) -> None:
        """One round of the reservation reaper; never raises (the core task must live)."""
        try:
            if heartbeat or not self._store.writable():
                await self._store.heartbeat(at=self._clock())
            await self.expire_reservations()
        except StateError as exc:
            log.warning("the state store cannot write: %s", exc)
        except GpushareError as exc:
            log.error("reservation reaper: %s", exc)


def _check_owner(leases: Sequence[Lease], owner: str, what: str) -> None:
    """Refuse if any of ``leases`` was made by another caller (one made before owners
    were recorded belongs to nobody in particular)."""
    if any(x.owner and x.owner != owner for x in leases):
        raise PermissionDeniedError(f"{what} was made by another caller")


def _outcome(ended: Sequence[Lease]) -> str:
    """What became of a gang, from its ended members as stored."""
    if any(x.state is LeaseState.EXPIRED for x in ended):
        return "expired"
    if all(x.state is LeaseState.RELEASED and x.reason.endswith("aborted") for x in ended):
        return "aborted"
    return "ended"
