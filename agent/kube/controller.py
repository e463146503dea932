"""The lease lifecycle controller: a pod that ends (Succeeded, Failed, deleted, force
deleted) gives its lease back, then loses the ``gpushare.io/lease`` finalizer; and every
agent's pod leases are reconciled against the pods that exist, at start and periodically,
so a lease whose pod is gone (a bind that died half way, a pod removed while the
controller was down) is released.

It keeps no state of its own: the pods' finalizers and annotations and the agents' leases
are the state, so a restart neither leaks nor double-releases (a Release of an ended lease
is answered as done).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from agent.kube.annotations import FINALIZER, SCHEDULER_NAME
from agent.kube.cache import AgentCache
from agent.kube.port import Conflict, Gone, KubeApi, KubeError, NotFound, Obj

log = logging.getLogger(__name__)

ENDED_PHASES = ("Succeeded", "Failed")
DONE_CODES = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


def ended(pod: Obj) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return bool(meta.get("deletionTimestamp")) or status.get("phase") in ENDED_PHASES


def holds_finalizer(pod: Obj) -> bool:
    return FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])


class LeaseController:
    def __init__(
        self,
        api: KubeApi,
        cache: AgentCache,
        *,
        reconcile_interval_s: float = 60.0,
        grace_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._cache = cache
        self._interval_s = reconcile_interval_s
        self._grace_s = grace_s  # a lease younger than this may belong to a bind in flight
        self._clock = clock
        self.pods: dict[str, Obj] = {}  # uid -> the newest pod seen
        self.released = 0

    async def run(self) -> None:
        """List, handle, watch; a watch that expires (410) lists again. Reconciles every
        ``reconcile_interval_s`` beside it."""
        reconciling = asyncio.create_task(self._reconcile_forever(), name="lease-reconcile")
        try:
            while True:
                version = await self.relist()
                try:
                    async for change in self._api.watch_pods(version, field_selector=_MINE):
                        if change.kind == "BOOKMARK":
                            continue
                        await self.handle(change.obj, deleted=change.kind == "DELETED")
                except Gone:
                    log.info("pod watch expired (410): listing again")
        finally:
            reconciling.cancel()
            await asyncio.gather(reconciling, return_exceptions=True)

    async def relist(self) -> str:
        listing = await self._api.list_pods(field_selector=_MINE)
        self.pods = {p["metadata"]["uid"]: p for p in listing.items}
        for pod in listing.items:
            await self.handle(pod)
        return listing.resource_version

    async def handle(self, pod: Obj, *, deleted: bool = False) -> None:
        uid = pod["metadata"]["uid"]
        if deleted:
            self.pods.pop(uid, None)
            await self._release_of(pod)  # gone without our finalizer: still give it back
            return
        self.pods[uid] = pod
        if ended(pod) and holds_finalizer(pod) and await self._release_of(pod):
            await self._drop_finalizer(pod)

    async def _release_of(self, pod: Obj) -> bool:
        """Release the pod's leases; True once none is live. A lease is the pod's by the
        agent's own record (its request id is the pod's UID, its pod the pod's name), never
        by the pod's annotation, which a user could point at another pod's lease."""
        key, uid = _key(pod)
        node = (pod.get("spec") or {}).get("nodeName", "")
        entry = self._cache.nodes.get(node)
        if not node or entry is None or entry.snapshot is None:
            return True  # never bound, or no agent: the reconcile covers any lease
        mine = [x for x in entry.snapshot.leases if x.request_id == uid and x.pod == key]
        done = [await self.release(node, x.lease_id, why=f"pod {key} ended") for x in mine]
        return all(done)

    async def release(self, node: str, lease_id: str, *, why: str) -> bool:
        link = self._cache.link(node)
        if link is None:
            log.warning("cannot release %s (%s): %s", lease_id, why, self._cache.why_unknown(node))
            return False
        try:
            await link.release(lease_id)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in DONE_CODES:
                log.warning("release of %s on %s failed: %s", lease_id, node, exc.details())
                return False
            return True
        self.released += 1
        log.info("released %s on %s: %s", lease_id, node, why)
        return True

    async def _drop_finalizer(self, pod: Obj) -> None:
        """Remove our finalizer, compare-and-set on the resourceVersion (409: read again)."""
        meta = pod["metadata"]
        for _ in range(5):
            kept = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
            patch = {"metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}}
            try:
                await self._api.patch_pod(meta["namespace"], meta["name"], patch)
                return
            except Conflict:
                meta = (await self._api.get_pod(meta["namespace"], meta["name"]))["metadata"]
            except NotFound:
                return
        log.warning("finalizer of %s/%s not removed: conflicts", meta["namespace"], meta["name"])

    # -- reconcile -------------------------------------------------------------------------

    async def _reconcile_forever(self) -> None:
        while True:
            try:
                await self.reconcile()
            except KubeError as exc:
                log.warning("reconcile: %s", exc)
            await asyncio.sleep(self._interval_s)

    async def reconcile(self) -> int:
        """Release every agent's pod lease, older than the grace, whose pod is gone, is
        another pod of that name, ended, or is bound to another node or to none (a bind
        that died half way); returns how many."""
        placed = {
            _key(p): (p.get("spec") or {}).get("nodeName", "")
            for p in self.pods.values()
            if not ended(p)
        }
        count = 0
        now = self._clock()
        for node, entry in list(self._cache.nodes.items()):
            for lease in entry.snapshot.leases if entry.snapshot is not None else ():
                young = now - lease.created_at <= self._grace_s
                if not lease.pod or lease.state == "reserved" or young:
                    continue
                where = placed.get((lease.pod, lease.request_id))
                if where != node:
                    why = "is gone" if where is None else f"is bound to {where or 'no node'}"
                    count += await self.release(node, lease.lease_id, why=f"its pod {why}")
        return count


def _key(pod: Obj) -> tuple[str, str]:
    meta = pod["metadata"]
    return f"{meta['namespace']}/{meta['name']}", meta["uid"]


_MINE = f"spec.schedulerName={SCHEDULER_NAME}"
