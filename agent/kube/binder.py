"""The extender's bind: the node's agent decides (``Admit``, or ``Reserve`` then
``Commit`` for a gang, with the pod UID as request id), the pod is annotated with its
lease, then bound. Any failure gives back what was taken (``Release``, ``Abort``) and
leaves the pod unbound, so the scheduler tries again.

The kubelet's ``Allocate`` does not say which pod it is for; the agent pairs each with the
oldest lease of a pod not yet allocated. So on each node the binds are held in order: a
pod is bound only once the kubelet has allocated the previous one there (the agent's
``lease.allocated`` event) or that hold has expired (``hold_s``; the agent skips holds
older than that). A pairing that still goes wrong is caught on the node by the
PodResources check and refused at PreStartContainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.core.lease import ENDED_REQUEST_ID_HINT
from agent.kube.annotations import LEASE_ANNOTATION, AnnotationError, PodAsk, parse_ask
from agent.kube.cache import AgentCache
from agent.kube.port import KubeApi, KubeError, NotFound, Obj
from agent.kube.views import lease_of, pod_request_id

log = logging.getLogger(__name__)

MAX_REQUEST_IDS = 8  # request ids tried in one bind
ATTEMPTS_KEPT = 10_000
PRIORITY = {"guaranteed": pb.GUARANTEED, "burstable": pb.BURSTABLE, "best-effort": pb.BEST_EFFORT}


@dataclass(frozen=True, slots=True)
class BindOptions:
    hold_s: float = 30.0  # how long a bound pod may take to be allocated by its kubelet
    gang_ttl_s: float = 120.0  # how long a gang's members may take to all be reserved


@dataclass
class Gang:
    key: str
    size: int
    deadline: float
    members: dict[str, tuple[str, pb.Lease]] = field(default_factory=dict)  # uid -> node, lease
    done: asyncio.Event = field(default_factory=asyncio.Event)
    failed: str = ""
    # after the commit: per node, the members' lease ids in the agent's allocation order
    order: dict[str, list[str]] = field(default_factory=dict)
    turn: asyncio.Condition = field(default_factory=asyncio.Condition)


class BindError(Exception):
    """Why a pod was not bound (the sentence the scheduler shows)."""


class Binder:
    def __init__(
        self,
        api: KubeApi,
        cache: AgentCache,
        options: BindOptions = BindOptions(),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._cache = cache
        self._options = options
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._last_bound: dict[str, str] = {}  # node -> lease id bound last, maybe not allocated
        self._gangs: dict[str, Gang] = {}
        self._attempts: dict[str, int] = {}  # pod uid -> its request id's attempt, newest last
        self.queued: Counter[str] = Counter()  # node -> binds to it in progress or waiting

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind the pod to ``node`` under a lease; "" on success, else why not."""
        try:
            pod = await self._api.get_pod(namespace, name)
            if uid and pod["metadata"].get("uid") != uid:
                return f"pod {namespace}/{name} is not the one scheduled (uid changed)"
            if bound := (pod.get("spec") or {}).get("nodeName"):
                # a bind sent again (its answer lost, or from a stale view of the pod): the
                # pod's lease is granted and in use; asking again, annotating or giving back
                # would touch it
                return "" if bound == node else f"pod {namespace}/{name} is bound to {bound}"
            ask = parse_ask(pod)
            if ask.gang_id:
                await self._bind_gang_member(pod, ask, node)
            else:
                await self._bind_one(pod, ask, node)
        except (BindError, AnnotationError) as exc:
            log.info("bind %s/%s on %s: %s", namespace, name, node, exc)
            return str(exc)
        except NotFound:
            return f"pod {namespace}/{name} is gone"
        return ""

    # -- one pod ---------------------------------------------------------------------------

    async def _bind_one(self, pod: Obj, ask: PodAsk, node: str) -> None:
        link = self._link(node)
        with self._queued(node):
            async with self._lock(node):
                fields = request_fields(pod, ask)
                answer = await self._granted(
                    node,
                    pod,
                    lambda request_id: link.admit(**{**fields, "request_id": request_id}),
                )
                if not answer.decision.admitted:
                    raise BindError(f"{node}: {answer.decision.reason}: {answer.decision.message}")
                await self._place(
                    pod, node, answer.lease, undo=lambda: link.release(answer.lease.lease_id)
                )

    async def _place(
        self, pod: Obj, node: str, lease: pb.Lease, *, undo: Callable[[], Any]
    ) -> None:
        """Annotate, wait until the pod bound before on the node is allocated, and bind;
        on any failure give the lease back and say why.

        The lease may be granted and the pod annotated while the previous pod's Allocate is
        still on its way (the agent hands that Allocate the older lease, the previous
        pod's); only the Binding, which lets the kubelet allocate this pod, has to wait."""
        self._cache.add_pending(node, lease_of(lease))
        meta = pod["metadata"]
        try:
            await self._api.patch_pod(
                meta["namespace"],
                meta["name"],
                {"metadata": {"annotations": {LEASE_ANNOTATION: lease.lease_id}}},
            )
            await self._wait_previous(node)
            await self._api.bind_pod(meta["namespace"], meta["name"], meta["uid"], node)
        except KubeError as exc:
            self._cache.drop_pending(node, lease.lease_id)
            try:
                await undo()
            except grpc.aio.AioRpcError as undo_exc:  # the controller's reconcile ends it
                log.warning(
                    "lease %s not given back after a failed bind: %s", lease.lease_id, undo_exc
                )
            raise BindError(f"binding to {node} failed: {exc}") from exc
        self._last_bound[node] = lease.lease_id

    async def _wait_previous(self, node: str) -> None:
        previous = self._last_bound.pop(node, None)
        if previous is not None and not await self._cache.wait_allocated(
            node, previous, self._options.hold_s
        ):
            log.warning(
                "lease %s on %s was not allocated within %.0f s",
                previous,
                node,
                self._options.hold_s,
            )

    # -- gangs -----------------------------------------------------------------------------

    async def _bind_gang_member(self, pod: Obj, ask: PodAsk, node: str) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{ask.gang_id}"
        gang = self._gangs.get(key)
        if gang is None or (gang.done.is_set() and gang.failed):
            gang = Gang(key, ask.gang_size, self._clock() + self._options.gang_ttl_s)
            self._gangs[key] = gang
        link = self._link(node)
        fields = request_fields(pod, ask)
        ttl_s = self._options.gang_ttl_s
        answer = await self._granted(
            node,
            pod,
            lambda request_id: link.reserve(
                key, ttl_s=ttl_s, **{**fields, "request_id": request_id}
            ),
        )
        if not answer.decision.admitted:
            raise BindError(f"{node}: {answer.decision.reason}: {answer.decision.message}")
        gang.members[meta["uid"]] = (node, answer.lease)
        if len(gang.members) >= gang.size and not gang.done.is_set():
            await self._commit(gang)
        await self._wait_gang(gang)
        if gang.failed:
            raise BindError(gang.failed)
        await self._bind_in_turn(gang, pod, node, answer.lease, link)

    async def _bind_in_turn(
        self, gang: Gang, pod: Obj, node: str, lease: pb.Lease, link: Any
    ) -> None:
        """Bind when this member is first in its node's order. The commit took the node's
        lock, so no other pod binds there in between; the last member gives it back."""
        async with gang.turn:
            await gang.turn.wait_for(lambda: gang.order[node][0] == lease.lease_id)
        try:
            with self._queued(node):
                await self._place(pod, node, lease, undo=lambda: link.release(lease.lease_id))
        finally:
            async with gang.turn:
                gang.order[node].pop(0)
                if not gang.order[node]:
                    self._lock(node).release()
                gang.turn.notify_all()

    async def _wait_gang(self, gang: Gang) -> None:
        left = gang.deadline - self._clock()
        try:
            await asyncio.wait_for(gang.done.wait(), max(left, 0.0))
        except TimeoutError:
            if not gang.done.is_set():
                gang.failed = (
                    f"gang {gang.key}: {len(gang.members)} of {gang.size} members reserved "
                    f"within {self._options.gang_ttl_s:.0f} s: aborted"
                )
                await self._abort(gang)
                gang.done.set()

    async def _commit(self, gang: Gang) -> None:
        """Commit on every node of the gang while holding those nodes' locks (in name
        order: no deadlock), which its members' binds give back."""
        nodes = sorted({node for node, _ in gang.members.values()})
        for node in nodes:
            await self._lock(node).acquire()
        try:
            for node in nodes:
                # The members were reserved before the pod bound last on the node was
                # admitted, so once committed they are older than its lease: the agent hands
                # the next Allocate the oldest admitted lease not yet allocated, and that
                # pod's Allocate would get a member's lease. Commit once it is allocated.
                await self._wait_previous(node)
            for node in nodes:  # a commit that fails is FAILED_PRECONDITION: a BindError
                await _agent_call(node, self._link(node).commit(gang.key))
        except BindError as exc:
            gang.failed = str(exc)
            await self._abort(gang)
            for node in nodes:
                self._lock(node).release()
        else:
            for node in nodes:
                leases = [x for n, x in gang.members.values() if n == node]
                gang.order[node] = [x.lease_id for x in sorted(leases, key=lambda x: x.created_at)]
        gang.done.set()

    async def _abort(self, gang: Gang) -> None:
        for node in sorted({node for node, _ in gang.members.values()}):
            link = self._cache.link(node)
            if link is None:
                continue
            try:
                await link.abort(gang.key)
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "gang %s: abort on %s failed (its TTL ends it): %s", gang.key, node, exc
                )

    # -- helpers ---------------------------------------------------------------------------

    async def _granted(
        self, node: str, pod: Obj, ask: Callable[[str], Awaitable[pb.AdmitResponse]]
    ) -> pb.AdmitResponse:
        """Ask with the pod's request id; when the agent answers that the id's lease has
        ended (a failed bind gave it back, its gang was aborted), ask with the next id."""
        uid = pod["metadata"]["uid"]
        for _ in range(MAX_REQUEST_IDS):
            attempt = self._attempts.get(uid, 0)
            try:
                return await ask(pod_request_id(uid, attempt))
            except grpc.aio.AioRpcError as exc:
                if not _ended_request_id(exc):
                    raise BindError(_refused(node, exc)) from exc
            self._attempts[uid] = attempt + 1
            while len(self._attempts) > ATTEMPTS_KEPT:
                del self._attempts[next(iter(self._attempts))]
        raise BindError(f"{node}: {MAX_REQUEST_IDS} ended leases in a row for pod {uid}")

    @contextlib.contextmanager
    def _queued(self, node: str) -> Iterator[None]:
        self.queued[node] += 1
        try:
            yield
        finally:
            self.queued[node] -= 1
            if not self.queued[node]:
                del self.queued[node]

    def _lock(self, node: str) -> asyncio.Lock:
        return self._locks.setdefault(node, asyncio.Lock())

    def _link(self, node: str) -> Any:
        link = self._cache.link(node)
        if link is None:
            raise BindError(f"{node}: {self._cache.why_unknown(node)}")
        return link


async def _agent_call(node: str, call: Any) -> Any:
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise BindError(_refused(node, exc)) from exc


def _refused(node: str, exc: grpc.aio.AioRpcError) -> str:
    return f"{node}: the agent refused: {exc.code().name}: {exc.details()}"


def _ended_request_id(exc: grpc.aio.AioRpcError) -> bool:
    return exc.code() is grpc.StatusCode.FAILED_PRECONDITION and ENDED_REQUEST_ID_HINT in (
        exc.details() or ""
    )


def request_fields(pod: Obj, ask: PodAsk) -> dict[str, Any]:
    """The agent request for this pod: its UID is the request id (a retry is the same
    request; :func:`pod_request_id` once a lease of it has ended), its namespace the
    tenant and the trust domain."""
    meta = pod["metadata"]
    return {
        "request_id": meta["uid"],
        "tenant": ask.tenant,
        "trust_domain": ask.trust_domain,
        "priority": PRIORITY[ask.priority.value],
        "memory_bytes": ask.memory_bytes,
        "thread_pct": ask.thread_pct,
        "workload": f"pod:{meta['uid']}",
        "pod": f"{meta['namespace']}/{meta['name']}",
    }
