"""The claims' reconcile: a lease of a claim that no longer exists, or is no longer
allocated to this node, is released and its CDI spec removed (a pod force-deleted, a
claim deallocated after its binding answer, an Unprepare that never came). Leases granted
after the listing began are left for the next pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agent.core.errors import GpushareError
from agent.dra.claims import (
    ClaimError,
    metadata,
    results_here,
)
from agent.kubeapi.port import Obj, ResourceApi
from agent.runtime.claims import claim_uid_of, share_of
from agent.runtime.dra import ClaimDriver

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        driver: ClaimDriver,
        api: ResourceApi,
        *,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._driver = driver
        self._api = api
        self._interval_s = interval_s
        self._clock = clock
        self.released = 0
        self.passes = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.once()
            except (GpushareError, OSError) as exc:  # the next pass tries again
                log.warning("claim reconcile failed: %s", exc)
            except Exception:
                log.exception("claim reconcile failed")

    async def once(self) -> None:
        """Release the shares no claim allocates to this node any more: each by its
        claim and share (a claim allocated here again holds new shares), only leases
        older than the listing, each checked again under its claim's lock."""
        started = self._clock()
        listing = await self._api.list_resource_claims()
        allocated, unreadable = self._allocated_here(listing.items)
        stale: dict[str, list[str]] = {}
        for lease in self._driver.live_leases():
            uid = claim_uid_of(lease.request_id)
            if not uid or not lease.held_by_claim or uid in unreadable:
                continue
            if (uid, share_of(lease.request_id)) not in allocated and lease.updated_at < started:
                stale.setdefault(uid, []).append(lease.lease_id)
        for uid, lease_ids in sorted(stale.items()):
            await self._release(uid, lease_ids, started)
        await self._remove_orphan_specs({uid for uid, _ in allocated} | unreadable)
        self.passes += 1

    async def _release(self, uid: str, lease_ids: list[str], started: float) -> None:
        leases = self._driver.leases
        async with leases.claim_lock(uid):
            still = [
                x.lease_id
                for x in self._driver.live_leases()
                if x.lease_id in lease_ids and x.updated_at < started
            ]
            released = await leases.release(still, uid, "its claim is gone from this node")
            if not any(claim_uid_of(x.request_id) == uid for x in self._driver.live_leases()):
                await asyncio.to_thread(self._driver.specs.remove, uid)
        self.released += len(released)
        if released:
            self._driver.note(
                "dra.claim_gone",
                f"claim {uid}: shares no longer allocated here; released {', '.join(released)}",
                {"metadata": {"uid": uid}},
            )

    def _allocated_here(self, claims: list[Obj]) -> tuple[set[tuple[str, str]], set[str]]:
        """(claim UID, share key) of every share allocated to this node, and the UIDs of
        claims that cannot be read (their leases are left alone)."""
        driver = self._driver
        allocated: set[tuple[str, str]] = set()
        unreadable: set[str] = set()
        for claim in claims:
            uid = str(metadata(claim).get("uid") or "")
            try:
                mine = results_here(claim, driver.driver_name, driver.node_name)
            except ClaimError:
                unreadable.add(uid)
                continue
            allocated.update((uid, share.key) for share in mine)
        return allocated, unreadable

    async def _remove_orphan_specs(self, kept: set[str]) -> None:
        live = {claim_uid_of(x.request_id) for x in self._driver.live_leases()}
        for uid in await asyncio.to_thread(self._driver.specs.claims):
            if uid not in kept and uid not in live:
                await asyncio.to_thread(self._driver.specs.remove, uid)
