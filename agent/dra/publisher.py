"""Publishing the node's pool: :class:`SlicePublisher` keeps the API's ResourceSlices of
the pool equal to the latest devices it was given (the pure parts, what a slice holds and
how a pool is planned, are :mod:`agent.dra.slices`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from agent.dra.slices import (
    Fits,
    PoolPlan,
    SliceDevice,
    TaintTimes,
    chunks_of,
    comparable,
    comparable_key,
    device_names,
    devices_of,
    generation_of,
    identity_of,
    keep_taint_times,
    key_of,
    name_of,
    owner_of,
    plan_pool,
    pool_of,
    slice_body,
    slice_count,
    taint_times,
    uid_of,
)
from agent.kubeapi.port import Conflict, KubeError, NotFound, Obj, ResourceApi

log = logging.getLogger(__name__)


class SlicePublisher:
    """Keeps the node's pool of slices equal to the devices last given to :meth:`publish`."""

    def __init__(
        self,
        api: ResourceApi,
        *,
        driver: str,
        node: str,
        min_interval_s: float = 1.0,
        resync_s: float = 30.0,
        backoff_max_s: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._api = api
        self.driver = driver
        self.node = node
        self._min_interval_s = min_interval_s
        self._resync_s = resync_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._desired: tuple[SliceDevice, ...] | None = None
        self._changed = asyncio.Event()
        self._node_uid = ""
        self.writes = 0  # creates, replaces and deletes sent
        self.generation = 0
        # a slice's devices as sent -> as the server kept them (fields it dropped)
        self._kept: dict[str, list[Any]] = {}
        self.dropped: list[str] = []  # device fields the server did not keep (logged once)
        self.synced = asyncio.Event()  # set once the API holds the latest devices

    def publish(self, devices: Sequence[SliceDevice]) -> None:
        """Ask for these devices to be published, in this order (give a stable one: a
        device moving to another slice is a change); returns at once (no I/O)."""
        desired = tuple(devices)
        if desired != self._desired:
            self._desired = desired
            self.synced.clear()
            self._changed.set()

    async def run(self) -> None:
        """Publish until cancelled: after each change, and every ``resync_s`` (a slice
        may have been deleted under us)."""
        failures = 0
        last_write = -self._min_interval_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self._resync_s)
            wait_s = last_write + self._min_interval_s - self._clock()
            if wait_s > 0:
                await asyncio.sleep(wait_s)  # coalesce: what changes meanwhile goes too
            self._changed.clear()
            try:
                if await self.sync_once():
                    last_write = self._clock()
                failures = 0
            except (KubeError, OSError) as exc:
                failures += 1
                delay_s = min(self._backoff_max_s, self._min_interval_s * 2.0**failures)
                log.warning(
                    "publishing the ResourceSlices failed (%s); again in %.1fs", exc, delay_s
                )
                self._changed.set()
                await asyncio.sleep(delay_s)

    async def sync_once(self) -> bool:
        """One comparison with the API and the writes it calls for (however many slices:
        one publish event); True if it wrote."""
        if self._desired is None:
            return False
        desired = self._desired
        chunks = chunks_of(desired)
        drafts = [slice_body(self.driver, self.node, "", c, 0, len(chunks)) for c in chunks]
        mine = await self._pool_slices()
        self.generation = max([self.generation, *map(generation_of, mine)])
        plan = self._plan(mine, drafts)
        must_read = plan.creates or (not plan.empty and not self._node_uid)
        if must_read and await self._owner_changed():  # slices naming the old one are stale
            plan = self._plan(mine, drafts)
        if not plan.empty:
            try:
                await self._apply(plan, chunks, drafts, taint_times(mine))
            except (KubeError, OSError):
                self._node_uid = ""  # read the owner again: a dead one may be why
                raise
        self._synced_if(desired)
        return not plan.empty

    async def _pool_slices(self) -> list[Obj]:
        listing = await self._api.list_resource_slices(
            field_selector=f"spec.nodeName={self.node},spec.driver={self.driver}"
        )
        return [s for s in listing.items if pool_of(s) == self.node]

    def _plan(self, mine: list[Obj], drafts: list[Obj]) -> PoolPlan:
        names = [device_names(d) for d in drafts]
        return plan_pool(mine, names, self._fits_of(drafts), self.generation + 1)

    def _fits_of(self, drafts: list[Obj]) -> Fits:
        """Does a stored slice publish ``drafts[i]``: the same devices, or what the server
        kept of them when it was last written (fields it drops, such as binding conditions
        or taints on a cluster without their feature gates, are not written again and
        again), the same count of slices, and the owner last read (when one was)?"""
        wanted = [comparable(d) for d in drafts]
        kept = [self._kept.get(comparable_key(w)) for w in wanted]
        owner = self._node_uid

        def fits(stored: Obj, index: int) -> bool:
            if slice_count(stored) != len(drafts) or owner not in ("", owner_of(stored)):
                return False
            return comparable(stored) in (wanted[index], kept[index])

        return fits

    async def _apply(
        self,
        plan: PoolPlan,
        chunks: list[tuple[SliceDevice, ...]],
        drafts: list[Obj],
        times: TaintTimes,
    ) -> None:
        """The plan's writes, then its deletes (the pool's new generation is whole before
        the old slices go). An untimed taint keeps the time it is stored with."""
        self.generation = max(self.generation, plan.generation)
        keys = [key_of(d) for d in drafts]
        self._kept = {k: v for k, v in self._kept.items() if k in keys}
        written = []
        for index, keep in plan.writes:
            body = slice_body(
                self.driver, self.node, self._node_uid, chunks[index], plan.generation, len(chunks)
            )
            stored = await self._write(keep, keep_taint_times(body, times))
            self._kept[keys[index]] = comparable(stored)
            written.append((body, stored))
        self._note_dropped(written)
        for other in plan.deletes:
            self.writes += 1
            with contextlib.suppress(NotFound):
                await self._api.delete_resource_slice(name_of(other), uid=uid_of(other))
        log.info(
            "published pool %s: %d slice(s) at generation %d (%d written, %d deleted)",
            self.node,
            len(chunks),
            plan.generation,
            len(plan.writes),
            len(plan.deletes),
        )

    def _note_dropped(self, written: list[tuple[Obj, Obj]]) -> None:
        """Say once which device fields the server did not keep of the slices written."""
        changed = [(b, s) for b, s in written if comparable(s) != comparable(b)]
        if not changed:
            return
        sent = {k for body, _ in changed for d in devices_of(body) for k in d}
        kept = {k for _, stored in changed for d in devices_of(stored) for k in d}
        dropped = sorted(sent - kept) or ["some values"]
        if dropped != self.dropped:
            self.dropped = dropped
            log.warning(
                "the API server dropped %s of the published devices (feature gates off?): "
                "the scheduler does not see them",
                ", ".join(dropped),
            )

    async def _write(self, keep: Obj | None, body: Obj) -> Obj:
        """Create or replace one slice; the object as the server stored it."""
        self.writes += 1
        if keep is None:
            return await self._api.create_resource_slice(body)
        body["metadata"] = {**body["metadata"], **identity_of(keep)}
        del body["metadata"]["generateName"]
        try:
            return await self._api.replace_resource_slice(name_of(keep), body)
        except Conflict:
            self._changed.set()  # changed under us: compare again at once
            raise

    async def _owner_changed(self) -> bool:
        """Read the Node object's UID again (before a slice is created: the object may
        have been created again, the slices of the old one collected as garbage); did it
        change?"""
        try:
            node = await self._api.get_node(self.node)
            uid = str((node.get("metadata") or {}).get("uid") or "")
        except NotFound:
            log.warning("node %s not found: its ResourceSlices have no owner", self.node)
            uid = ""
        changed, self._node_uid = uid != self._node_uid, uid
        return changed

    def _synced_if(self, desired: tuple[SliceDevice, ...]) -> None:
        if desired == self._desired:
            self.synced.set()
