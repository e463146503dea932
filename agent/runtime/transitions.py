"""Lease transitions after admission: release, gang commit and abort, expiry, clear-stale.

Each is decided under the ledger lock and written durably before it answers; a failed write
puts the ledger back as it was. Release, Commit and Abort are idempotent: asking again for
what is already done answers the same, so a client may retry them safely.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence

from agent.core.errors import ConflictError, NotFoundError, StateError
from agent.core.lease import ALLOWED_TRANSITIONS, Lease, LeaseState, transition
from agent.core.types import Event
from agent.state.port import StateStore

log = logging.getLogger(__name__)


class LeaseTransitions:
    """Mixed into NodeService, which provides the ledger, the lock and the store."""

    leases: dict[str, Lease]
    _lock: asyncio.Lock
    _store: StateStore
    _clock: Callable[[], float]
    _ended: dict[str, Lease]
    _expired_gangs: set[str]

    def _remember(self, lease: Lease) -> None:
        raise NotImplementedError

    def _lease_event(self, lease: Lease) -> Event:
        raise NotImplementedError

    async def _move(self, leases: list[Lease], target: LeaseState, reason: str) -> list[Lease]:
        now = self._clock()
        async with self._lock:
            current = [self.leases.get(x.lease_id, x) for x in leases]
            moved = [transition(lease, target, at=now, reason=reason) for lease in current]
            for lease in moved:
                self._remember(lease)
        try:
            await asyncio.shield(self._store.commit(moved, [self._lease_event(x) for x in moved]))
        except StateError:
            for lease in current:
                self._remember(lease)
            raise
        return moved

    async def end_leases(
        self, lease_ids: Sequence[str], target: LeaseState, reason: str
    ) -> list[Lease]:
        """End those of ``lease_ids`` still live (the control loops' way: released, failed,
        evicted); ones that ended meanwhile are left as they are."""
        live = [self.leases[i] for i in lease_ids if i in self.leases]
        live = [x for x in live if target in ALLOWED_TRANSITIONS[x.state]]
        return await self._move(live, target, reason) if live else []

    async def release(self, lease_id: str) -> Lease:
        lease = self.leases.get(lease_id)
        if lease is None:
            ended = self._ended.get(lease_id)
            if ended is not None and ended.state is LeaseState.RELEASED:
                return ended  # released before: answer the same
            raise NotFoundError(f"no live lease {lease_id!r}")
        (released,) = await self._move([lease], LeaseState.RELEASED, "released by the caller")
        return released

    async def mark_ready(self, lease: Lease, client_pids: list[int]) -> Lease:
        """A client of the lease appeared on its device."""
        now = self._clock()
        async with self._lock:
            current = self.leases.get(lease.lease_id, lease)
            ready = transition(
                current, LeaseState.READY, at=now, reason=f"client {client_pids[0]} connected"
            )
            ready = dataclasses.replace(ready, client_pids=tuple(client_pids))
            self._remember(ready)
        try:
            await asyncio.shield(self._store.commit([ready], [self._lease_event(ready)]))
        except StateError:
            self._remember(current)
            raise
        return ready

    async def mark_ineffective(self, lease: Lease) -> Lease:
        """Never ready by its deadline: the lease ends and its capacity is freed."""
        (ended,) = await self._move(
            [lease], LeaseState.INEFFECTIVE, "no client appeared before the readiness deadline"
        )
        return ended

    def _members(self, gang_id: str) -> list[Lease]:
        return [lease for lease in self.leases.values() if lease.gang_id == gang_id]

    async def commit(self, gang_id: str) -> list[Lease]:
        members = self._members(gang_id)
        reserved = [x for x in members if x.state is LeaseState.RESERVED]
        now = self._clock()
        expired = gang_id in self._expired_gangs or any(
            x.expires_at is not None and x.expires_at <= now for x in reserved
        )
        if expired:
            if reserved:
                await self._move(reserved, LeaseState.EXPIRED, "gang expired before commit")
            self._expired_gangs.add(gang_id)
            raise ConflictError(f"gang {gang_id!r} expired before it was committed")
        if not reserved:
            if members:
                return members  # committed before: answer the same
            raise NotFoundError(f"no reservation held for gang {gang_id!r}")
        return await self._move(reserved, LeaseState.ADMITTED, f"gang {gang_id} committed")

    async def abort(self, gang_id: str) -> list[Lease]:
        reserved = [x for x in self._members(gang_id) if x.state is LeaseState.RESERVED]
        if not reserved:
            ended = [
                x
                for x in self._ended.values()
                if x.gang_id == gang_id and x.state is LeaseState.RELEASED
            ]
            if ended:
                return ended
            raise NotFoundError(f"no reservation held for gang {gang_id!r}")
        return await self._move(reserved, LeaseState.RELEASED, f"gang {gang_id} aborted")

    def _due(self) -> list[Lease]:
        now = self._clock()
        return [
            x
            for x in self.leases.values()
            if x.state is LeaseState.RESERVED and x.expires_at is not None and x.expires_at <= now
        ]

    async def expire_reservations(self) -> list[Lease]:
        due = self._due()
        if not due:
            return []
        self._expired_gangs.update(x.gang_id for x in due if x.gang_id)
        return await self._move(due, LeaseState.EXPIRED, "reservation TTL passed")

    async def clear_stale(self, *, dry_run: bool) -> list[str]:
        """What is stale and, unless ``dry_run``, clear it: today, reservations past TTL."""
        due = self._due()
        actions = [f"expire reservation {x.lease_id} of gang {x.gang_id}" for x in due]
        if not dry_run and due:
            await self.expire_reservations()
        return actions

    async def reservation_reaper(
        self, *, interval_s: float = 1.0, heartbeat_every: int = 10
    ) -> None:
        """Expire reservations as their TTL passes, and check that the store can write: every
        ``heartbeat_every`` rounds, and every round while it cannot (a supervised task)."""
        rounds = 0
        while True:
            await asyncio.sleep(interval_s)
            rounds += 1
            try:
                if not self._store.writable() or rounds % heartbeat_every == 0:
                    await self._store.heartbeat(at=self._clock())
                await self.expire_reservations()
            except StateError as exc:
                log.warning("the state store cannot write: %s", exc)
