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
from collections.abc import Awaitable, Callable, Coroutine

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.kubeapi.port import (
    Conflict,
    Gone,
    KubeApi,
    KubeError,
    NotFound,
    Obj,
    annotations_of,
    ended,
)
from agent.legacy.cluster.annotations import SCHEDULER_NAME
from agent.legacy.cluster.cache import AgentCache
from agent.legacy.cluster.finalizer import drop_finalizer, holds_finalizer
from agent.legacy.cluster.leaseless import LeaselessPods, evicted_event, orphaned, placement
from agent.legacy.cluster.views import pod_uid_of
from agent.legacy.podleases import LEASE_ANNOTATION

log = logging.getLogger(__name__)

EVICTED = "lease.evicted"  # the agent's event when it evicted a lease
EVICTED_KEPT = 10_000
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
SETTLE_CONCURRENCY = 16  # ended pods given back at once, beside the watch
SETTLE_TRIES = 5
DONE_CODES = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


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
        # uid -> the newest (pod, deleted) seen while its settling runs, or None
        self._settling: dict[str, tuple[Obj, bool] | None] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # settlings and evicted pods' deletions
        self._slots = asyncio.Semaphore(SETTLE_CONCURRENCY)
        self._unsettled: set[str] = set()  # ended pods whose settling gave up (reconcile retries)
        self.evicted_pods = 0  # pods deleted because an agent evicted their lease
        # leases evicted lately, by id: (node, pod uid, why); a pod bound with one after the
        # event came is found by its own update
        self._evicted: dict[str, tuple[str, str, str]] = {}
        self._leaseless = LeaselessPods(grace_s)  # evictions missed (kube serve was down)
        self._synced = asyncio.Event()  # the first list is in the view
        self.acting = False  # while act() runs (the leader): handle() and events may write
        cache.listeners.append(self._agent_event)

    async def follow(self) -> None:
        """List, handle, watch; a watch that expires (410) lists again. Every replica
        follows (the extender's binds read the pods here); only :meth:`act` writes."""
        delay_s = RETRY_FIRST_S
        while True:
            try:
                await self._follow_pods()
                delay_s = RETRY_FIRST_S
            except Gone:
                log.info("pod watch expired (410): listing again")
            except KubeError as exc:  # unreachable, 5xx, 429: the same again, later
                log.warning("pods: %s; listing again in %.1f s", exc, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, RETRY_MAX_S)

    async def wait_synced(self) -> None:
        """Until the first list of the pods is in the view."""
        await self._synced.wait()

    async def act(self) -> None:
        """Settle ended pods, delete evicted ones and reconcile, from the first full view
        on, until cancelled (a lost leadership): then nothing more is started."""
        await self._synced.wait()
        self.acting = True
        try:
            for pod in list(self.pods.values()):  # what ended while nobody acted
                await self.handle(pod)
            await self._reconcile_forever()
        finally:
            self.acting = False
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._leaseless = LeaselessPods(self._grace_s)  # judged afresh next term

    async def _follow_pods(self) -> None:
        """List, then watch until the stream ends (a watch times out: list again)."""
        version = await self.relist()
        async for change in self._api.watch_pods(version, field_selector=_MINE):
            if change.kind == "BOOKMARK":
                continue
            await self.handle(change.obj, deleted=change.kind == "DELETED")

    def _agent_event(self, node: str, event: pb.Event) -> None:
        """A lease its agent evicted (``lease.evicted``: preempted for a guaranteed pod, or
        its device degraded) leaves its pod unable to run: no container of it may start
        without its lease. The pod is deleted, as kube-scheduler deletes the pods it
        preempts, so its owner places it again; an event (LeaseEvicted) on it says why."""
        if event.kind != EVICTED or not event.lease_id:
            return
        # the lease's own pod: its request id is the pod's UID (never the annotation alone,
        # which a user could point at another pod's lease)
        uid = pod_uid_of(event.attrs.get("request_id", ""))
        self._evicted[event.lease_id] = (node, uid, event.message)
        while len(self._evicted) > EVICTED_KEPT:
            del self._evicted[next(iter(self._evicted))]
        for pod in list(self.pods.values()) if self.acting else ():
            self._check_evicted(pod)

    def _check_evicted(self, pod: Obj) -> None:
        lease_id = annotations_of(pod).get(LEASE_ANNOTATION, "")
        node, uid, why = self._evicted.get(lease_id, ("", "", ""))
        meta = pod["metadata"]
        bound = (pod.get("spec") or {}).get("nodeName")
        if node and uid == meta["uid"] and bound == node and not ended(pod):
            del self._evicted[lease_id]
            self._spawn(self._delete_evicted(pod, node, why), f"evicted-{meta['uid']}")

    async def _delete_evicted(self, pod: Obj, node: str, why: str) -> None:
        """Delete the pod (tried again with backoff), then say why in an event (best
        effort: the deletion is what matters)."""
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        message = f"its lease on {node} was evicted ({why}): deleted, to be placed again"

        async def delete() -> bool:
            try:
                await self._api.delete_pod(meta["namespace"], meta["name"], uid=meta["uid"])
            except (NotFound, Conflict):
                return False  # gone, or another pod of that name: nothing to do
            return True

        if not await self._retrying(f"pod {key}: lease evicted, not deleted", delete):
            return
        self.evicted_pods += 1
        log.info("deleted pod %s: %s", key, message)
        try:
            await self._api.create_event(meta["namespace"], evicted_event(pod, message))
        except KubeError as exc:
            log.warning("pod %s: no LeaseEvicted event: %s", key, exc)

    async def _retrying(self, what: str, attempt: Callable[[], Awaitable[bool]]) -> bool:
        """``attempt()``'s answer, tried again with backoff after an API error; False once
        ``SETTLE_TRIES`` have failed (what is left is the next reconcile's)."""
        delay_s = RETRY_FIRST_S
        for _ in range(SETTLE_TRIES):
            try:
                return await attempt()
            except KubeError as exc:
                log.warning("%s: %s; again in %.1f s", what, exc, delay_s)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, RETRY_MAX_S)
        log.error("%s after %d tries", what, SETTLE_TRIES)
        return False

    def _spawn(self, work: Coroutine[object, object, None], name: str) -> None:
        if not self.acting:  # stopped meanwhile: a newer leader does it
            work.close()
            return
        task = asyncio.ensure_future(work)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def pod(self, uid: str) -> Obj | None:
        """The pod of this UID as the watch last showed it (None: not seen or gone)."""
        return self.pods.get(uid)

    async def relist(self) -> str:
        listing = await self._api.list_pods(field_selector=_MINE)
        self.pods = {p["metadata"]["uid"]: p for p in listing.items}
        for pod in listing.items:
            await self.handle(pod)
        self._synced.set()
        return listing.resource_version

    async def handle(self, pod: Obj, *, deleted: bool = False) -> None:
        """Keep the view current at once; give an ended pod's leases back and drop its
        finalizer beside the watch, so slow agents or API writes never hold the watch up
        (a watch that falls behind leaves the view stale)."""
        uid = pod["metadata"]["uid"]
        if deleted:
            self.pods.pop(uid, None)
            self._cache.forget_assumed(uid)
            if self.acting:  # gone without our finalizer: still give it back
                self._settle(pod, deleted=True)
            return
        self.pods[uid] = pod
        if not self.acting:
            return
        if ended(pod) and holds_finalizer(pod):
            self._settle(pod, deleted=False)
        elif self._evicted:
            self._check_evicted(pod)

    def _settle(self, pod: Obj, *, deleted: bool) -> None:
        """Settle this pod in a task of its own; one at a time per pod (a newer state
        seen meanwhile is settled after it)."""
        uid = pod["metadata"]["uid"]
        if uid in self._settling:
            self._settling[uid] = (pod, deleted)
            return
        self._settling[uid] = None
        self._spawn(self._settle_pod(uid, pod, deleted), f"settle-{uid}")

    async def _settle_pod(self, uid: str, pod: Obj, deleted: bool) -> None:
        try:
            while True:
                async with self._slots:
                    if not await self._settle_once(pod, deleted):
                        self._unsettled.add(uid)
                newer = self._settling.get(uid)
                if newer is None:
                    return
                self._settling[uid] = None
                pod, deleted = newer
        finally:
            self._settling.pop(uid, None)

    async def _settle_once(self, pod: Obj, deleted: bool) -> bool:
        """Release the pod's leases, then (unless it is gone) drop its finalizer; an API
        error is tried again with backoff. False: left to the next reconcile."""

        async def settle() -> bool:
            if not await self._release_of(pod):
                return False  # an agent did not answer: its release is logged
            if not deleted:
                await self._drop_finalizer(pod)
            return True

        return await self._retrying(f"pod {_key(pod)[0]} not settled", settle)

    async def _release_of(self, pod: Obj) -> bool:
        """Release the pod's leases; True once none is live. A lease is the pod's by the
        agent's own record (its request id is the pod's UID, its pod the pod's name), never
        by the pod's annotation, which a user could point at another pod's lease."""
        key, uid = _key(pod)
        bound = (pod.get("spec") or {}).get("nodeName", "")
        # unbound: a bind that died may have left a lease on any node
        nodes = [bound] if bound else list(self._cache.nodes)
        done = True
        for node in nodes:  # no agent there (now): the reconcile covers any lease
            for lease in self._cache.live_leases(node):
                if pod_uid_of(lease.request_id) == uid and lease.pod == key:
                    done &= await self.release(node, lease.lease_id, why=f"pod {key} ended")
        return done

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
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being stopped
            # the link closed under the call (its agent's stream broke): not released
            log.warning("release of %s on %s: the connection closed", lease_id, node)
            return False
        self.released += 1
        log.info("released %s on %s: %s", lease_id, node, why)
        return True

    async def _drop_finalizer(self, pod: Obj) -> None:
        await drop_finalizer(self._api, pod)

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
        another pod of that name, ended, or is bound to another node; returns how many.

        A lease whose pod lives unbound (a bind that died after the grant) is kept: the
        scheduler tries the pod again, the extender does not count the lease against it,
        and the agent answers the retry (same request id, the pod's UID) with that same
        lease. Released here, the lease's request id could never be used again and the
        pod would never bind. If the retry goes to another node, this lease is then bound
        elsewhere and released; if the pod ends, it is released as the pod's."""
        placed = {_key(p): placement(p) for p in self.pods.values() if not ended(p)}
        count = 0
        now = self._clock()
        for node, entry in list(self._cache.nodes.items()):
            for lease in entry.snapshot.leases if entry.snapshot is not None else ():
                if lease.lease_id in entry.ended:
                    continue  # its end came since the answer
                young = now - lease.created_at <= self._grace_s
                settling = pod_uid_of(lease.request_id) in self._settling  # released there
                if not lease.pod or lease.state == "reserved" or young or settling:
                    continue
                key = (lease.pod, pod_uid_of(lease.request_id))
                why = orphaned(lease, node, placed.get(key))
                if why and key not in placed and not self._ended_in_view(key[1]):
                    why = await self._confirmed_orphaned(lease, node, key)
                if why:
                    count += await self.release(node, lease.lease_id, why=f"its pod {why}")
        for gone in self._leaseless.due(list(self.pods.values()), self._cache.nodes, now):
            uid = gone.pod["metadata"]["uid"]
            self._spawn(self._delete_evicted(gone.pod, gone.node, gone.why), f"leaseless-{uid}")
        for uid in list(self._unsettled):  # settling that gave up: once more
            self._unsettled.discard(uid)
            if (pod := self.pods.get(uid)) is not None and holds_finalizer(pod):
                self._settle(pod, deleted=False)
        return count

    def _ended_in_view(self, uid: str) -> bool:
        pod = self.pods.get(uid)
        return pod is not None and ended(pod)

    async def _confirmed_orphaned(self, lease: pb.Lease, node: str, key: tuple[str, str]) -> str:
        """The view has not seen this lease's pod: it may be gone, or the watch may be
        behind (a pod created and bound since). Ask the API before releasing; "" when
        the pod lives there as the lease's, or the API cannot say now."""
        namespace, _, name = key[0].partition("/")
        try:
            pod = await self._api.get_pod(namespace, name)
        except NotFound:
            return "is gone or ended"
        except KubeError as exc:
            log.warning("reconcile: cannot read pod %s: %s; kept for now", key[0], exc)
            return ""
        if _key(pod) != key or ended(pod):
            return "is gone or ended"
        return orphaned(lease, node, placement(pod))


def _key(pod: Obj) -> tuple[str, str]:
    meta = pod["metadata"]
    return f"{meta['namespace']}/{meta['name']}", meta["uid"]


_MINE = f"spec.schedulerName={SCHEDULER_NAME}"
