"""The extender's bind: the node's agent decides (``Admit``, or ``Reserve`` then
``Commit`` for a gang, with the pod UID as request id), then the pod is bound with its
lease as an annotation of the Binding (the API server copies a Binding's annotations onto
the pod, so the lease and the node are set in one write). A failure gives back what was
taken (``Release``, ``Abort``) and leaves the pod unbound, so the scheduler tries again.

A bind runs in a task of its own: a caller that goes away (the scheduler closed the
connection, the handler was cancelled) leaves it to end as it would have, bound or given
back, never half way. Binds of one pod run one at a time; one sent again meanwhile waits
for the first, then reads the pod afresh. :meth:`Binder.aclose` lets a Binding in flight
end first.

A Binding whose answer is not sure (a 5xx, a timeout, a broken connection) is sent again
until it is, and a 409 is resolved by reading the pod back (:mod:`agent.legacy.cluster.binding`).
Bound to the node with this lease, the bind is done; not bound, the lease is given back
(and, if the agent does not take it back, the node's next pod waits for its hold). Unknown
(no answer is sure in time, or the pod could not be read back), nothing is guessed: the
lease is kept (:mod:`agent.legacy.cluster.kept`), the bind answers why, and the pod's next try takes
the same lease (same request id) or, bound elsewhere, gives it back. Left alone (``kube
serve`` stops), the lease controller's reconcile keeps it while the pod lives unbound or
bound with it, and releases it once the pod is gone or bound elsewhere.

A member of a gang committed before (:mod:`agent.legacy.cluster.gangs`), bound again after its
Binding failed, gets its committed lease back (``Reserve``, same request id) or, that one
given back, a new reservation committed on its own; it takes a turn ahead of the pods
waiting.

The kubelet's ``Allocate`` does not say which pod it is for; the agent pairs each with the
oldest lease of a pod not yet allocated. So each node has a line: a pod is admitted and
bound only once the pod before it in the line has been allocated by the kubelet (the
agent's ``lease.allocated`` event), its bind has failed, or its hold has expired
(``hold_s``; the agent skips holds older than that). A pod is admitted only when its turn
comes, so its hold starts just before its Binding, however long the line. A pairing that
still goes wrong is caught on the node by the PodResources check and refused at
PreStartContainer.

The share's UID (:attr:`agent.legacy.cluster.annotations.PodAsk.run_as_uid`) goes with the Admit or
Reserve, so the agent keeps one user per MPS server; with ``require_user`` (the default)
a pod whose share's containers do not state one UID is not admitted
(:func:`agent.legacy.cluster.annotations.check_one_user`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.core.lease import LeaseState
from agent.kubeapi.port import KubeApi, KubeError, NotFound, Obj, annotations_of
from agent.legacy.cluster import binding
from agent.legacy.cluster.annotations import AnnotationError, PodAsk, parse_ask
from agent.legacy.cluster.binding import Outcome
from agent.legacy.cluster.cache import AgentCache
from agent.legacy.cluster.calls import (
    BindError,
    agent_call,
    ended_request_id,
    give_back,
    link_closed_fails,
    link_of,
    refused_by,
)
from agent.legacy.cluster.gangs import Gangs
from agent.legacy.cluster.kept import Kept, KeptLeases
from agent.legacy.cluster.line import Lines, Turn
from agent.legacy.cluster.views import lease_of, pod_request_id, request_fields
from agent.legacy.podleases import LEASE_ANNOTATION

__all__ = ["BindError", "BindOptions", "Binder"]

log = logging.getLogger(__name__)

MAX_REQUEST_IDS = 8  # request ids tried in one bind
ATTEMPTS_KEPT = 10_000  # pods whose request id's attempt is remembered

# the pod of this UID as an informer last saw it, or None (then it is read from the API)
PodLookup = Callable[[str], Obj | None]


@dataclass(frozen=True, slots=True)
class BindOptions:
    hold_s: float = 30.0  # how long a bound pod may take to be allocated by its kubelet
    gang_ttl_s: float = 120.0  # how long a gang's members may take to all be reserved
    # how long a Binding whose answer is not sure is sent again before its lease is kept
    # for the pod's next try
    resolve_s: float = 10.0


class Binder:
    def __init__(
        self,
        api: KubeApi,
        cache: AgentCache,
        options: BindOptions = BindOptions(),
        *,
        pods: PodLookup | None = None,
        clock: Callable[[], float] = time.monotonic,
        require_user: bool = True,
    ) -> None:
        self._api = api
        self._require_user = require_user
        self._cache = cache
        self._options = options
        self._pods = pods
        self._lines = Lines(cache, hold_s=options.hold_s, clock=clock)
        self._gangs = Gangs(cache, self._lines, ttl_s=options.gang_ttl_s, clock=clock)
        self._attempts: dict[str, int] = {}  # pod uid -> its request id's attempt, newest last
        self._kept = KeptLeases(cache, self._lines)
        self.in_flight: dict[str, asyncio.Task[str]] = {}  # pod -> its bind in progress
        self._placing_keys: set[str] = set()  # pods whose Binding is in flight
        self._closed = False
        self.queued: Counter[str] = Counter()  # node -> binds to it in progress or waiting

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind the pod to ``node`` under a lease; "" on success, else why not. The bind
        runs in a task the caller's cancellation does not reach; one of the same pod
        still running is waited for first."""
        key = uid or f"{namespace}/{name}"
        again = False
        while (running := self.in_flight.get(key)) is not None:
            again = True
            await asyncio.wait([running])
        if self._closed:
            return f"pod {namespace}/{name} not bound: the extender is stopping"
        task = asyncio.create_task(
            self._bind(namespace, name, uid, node, fresh=again), name=f"bind-{namespace}/{name}"
        )
        self.in_flight[key] = task
        task.add_done_callback(partial(self._bind_ended, key))
        return await asyncio.shield(task)

    def _bind_ended(self, key: str, task: asyncio.Task[str]) -> None:
        if self.in_flight.get(key) is task:
            del self.in_flight[key]
        if not task.cancelled() and (failure := task.exception()) is not None:
            log.error("bind of %s failed", key, exc_info=failure)

    async def aclose(self) -> None:
        """Stop the binds in progress. A Binding in flight ends first (bound, or its
        lease given back); the others stop where they are, and what an agent granted them
        is the pod's next try's (the same request id gets it back) or ends on its own (a
        gang's reservations, at their TTL)."""
        self._closed = True
        tasks = list(self.in_flight.items())
        for key, task in tasks:
            if key not in self._placing_keys:
                task.cancel()
        await asyncio.gather(*(task for _key, task in tasks), return_exceptions=True)

    async def _bind(self, namespace: str, name: str, uid: str, node: str, *, fresh: bool) -> str:
        assumed = None
        try:
            pod = await self._pod(namespace, name, uid, fresh=fresh or uid in self._kept)
            if uid and pod["metadata"].get("uid") != uid:
                return f"pod {namespace}/{name} is not the one scheduled (uid changed)"
            if bound := (pod.get("spec") or {}).get("nodeName"):
                # a bind sent again (its answer lost, or from a stale view of the pod): the
                # pod's lease is granted and in use; asking again, annotating or giving back
                # would touch it
                await self._kept.settle(uid, (bound, annotations_of(pod).get(LEASE_ANNOTATION, "")))
                return "" if bound == node else f"pod {namespace}/{name} is bound to {bound}"
            ask = parse_ask(pod, require_user=self._require_user)
            assumed = self._cache.keep_assumed(uid, node)  # counted while it waits its turn
            with self._queued(node):
                if ask.gang_id:
                    await self._bind_gang_member(pod, ask, node)
                else:
                    await self._bind_one(pod, ask, node)
        except (BindError, AnnotationError) as exc:
            log.info("bind %s/%s on %s: %s", namespace, name, node, exc)
            return str(exc)
        except NotFound:
            await self._kept.settle(uid, None)
            return f"pod {namespace}/{name} is gone"
        except KubeError as exc:
            return f"pod {namespace}/{name} not read: {exc}"
        finally:  # its expected placement counted until now (the lease, if any, from now)
            if assumed is not None:
                self._cache.forget_assumed(uid, only=assumed)
        return ""

    async def _pod(self, namespace: str, name: str, uid: str, *, fresh: bool = False) -> Obj:
        """The pod as the informer has it (no read per bind), else, or when ``fresh``
        (a bind of it ran just before, whose write the informer may not show yet), as the
        API has it. A stale view is safe: a pod bound meanwhile makes the Binding a 409,
        resolved there."""
        known = self._pods(uid) if self._pods is not None and uid and not fresh else None
        meta = (known or {}).get("metadata") or {}
        if known is not None and (meta.get("namespace"), meta.get("name")) == (namespace, name):
            return known
        return await self._api.get_pod(namespace, name)

    # -- one pod ---------------------------------------------------------------------------

    async def _bind_one(self, pod: Obj, ask: PodAsk, node: str) -> None:
        link = link_of(self._cache, node)
        fields = _fields(pod, ask)
        kept = self._kept.get(pod["metadata"]["uid"])
        if kept is not None and kept.node == node:  # its lease is the one kept
            turn = self._kept.turn(pod["metadata"]["uid"], node)
        else:
            [turn] = self._lines.new_turns(node, 1)
        async with self._lines.taken(node, turn):
            answer = await self._granted(
                node,
                pod,
                lambda request_id: link.admit(**{**fields, "request_id": request_id}),
            )
            if not answer.decision.admitted:
                raise BindError(f"{node}: {answer.decision.reason}: {answer.decision.message}")
            lease_id = answer.lease.lease_id
            await self._place(pod, node, answer.lease, turn, undo=lambda: link.release(lease_id))

    async def _place(
        self,
        pod: Obj,
        node: str,
        lease: pb.Lease,
        turn: Turn,
        *,
        undo: Callable[[], Any],
    ) -> None:
        """Bind (the pod before this one in the line is done) with the lease as the
        Binding's annotation, to its end: :meth:`aclose` does not cancel a bind here (and
        nothing else cancels a bind's task)."""
        meta = pod["metadata"]
        key = meta["uid"] or f"{meta['namespace']}/{meta['name']}"
        self._placing_keys.add(key)
        try:
            await self._placing(pod, node, lease, (turn, undo))
        finally:
            self._placing_keys.discard(key)

    async def _placing(
        self, pod: Obj, node: str, lease: pb.Lease, ending: tuple[Turn, Callable[[], Any]]
    ) -> None:
        """Bind, and resolve an answer that says nothing sure: bound, the lease stays;
        not bound, it is given back; unknown, it is kept for the pod's next try. The turn
        ends in every case, after the lease is given back (until then the agent may still
        hand it to the kubelet), with the lease if the pod is or may be bound."""
        turn, undo = ending
        self._cache.add_pending(node, lease_of(lease))
        meta = pod["metadata"]
        ended_with = ""
        try:
            if turn.overtaken:  # the next pod went on meanwhile: not two to pair at once
                await give_back(self._cache, node, lease.lease_id, undo)
                raise BindError(
                    f"{node}: the bind took longer than the hold ({self._options.hold_s:.0f} s) "
                    "and the next pod on the node went on: its lease is given back, try again"
                )
            outcome, why = await binding.bind(
                self._api, meta, node, lease.lease_id, resolve_s=self._options.resolve_s
            )
            if outcome is Outcome.BOUND:
                ended_with = lease.lease_id
                await self._kept.settle(meta["uid"], (node, lease.lease_id))
                return
            if outcome is Outcome.UNKNOWN:
                ended_with = lease.lease_id
                self._kept.keep(meta["uid"], Kept(node, lease.lease_id, turn))
                raise BindError(why)
            self._kept.forget(meta["uid"], lease.lease_id)  # given back now, if kept
            if not await give_back(self._cache, node, lease.lease_id, undo):
                ended_with = lease.lease_id  # still live: the next waits for its hold
            raise BindError(why)
        finally:
            self._lines.end(node, turn, ended_with)

    # -- gangs -----------------------------------------------------------------------------

    async def _bind_gang_member(self, pod: Obj, ask: PodAsk, node: str) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        key = f"{meta['namespace']}/{ask.gang_id}"
        link = link_of(self._cache, node)
        fields = _fields(pod, ask)
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
        lease = answer.lease
        if (
            self._gangs.committed_with(uid) == key
            or lease.state == LeaseState.ADMITTED.value
            or self._gangs.running(key, pod)
        ):
            await self._bind_again(pod, node, lease, key)  # its gang was committed before
            return
        gang = self._gangs.join(key, ask.gang_size, uid, node, lease)
        if len(gang.members) >= gang.size and not gang.turns:  # no commit under way
            await self._gangs.commit(gang)
        await self._gangs.wait(gang)
        if gang.failed:
            raise BindError(gang.failed)
        turn = gang.turns.get(lease.lease_id)
        if turn is None:  # reserved once its gang's commit had begun
            await self._bind_again(pod, node, lease, key)
            return
        async with self._lines.taken(node, turn):
            await self._place(pod, node, lease, turn, undo=lambda: link.release(lease.lease_id))

    async def _bind_again(self, pod: Obj, node: str, lease: pb.Lease, key: str) -> None:
        """A member of a gang committed before, bound again (its Binding failed, or its
        answer was lost): its lease is the committed one, or a new reservation (that one
        was given back), committed on its own once its turn has come. It takes a turn
        ahead of the pods not admitted yet, as its gang's members did; a reservation
        committed before its turn would be an admitted lease older than the pod bound
        meanwhile, whose Allocate would get it."""
        link = link_of(self._cache, node)
        undo = partial(link.release, lease.lease_id)
        turn = self._kept.turn(pod["metadata"]["uid"], node)
        async with self._lines.taken(node, turn):
            if lease.state == LeaseState.RESERVED.value:
                try:
                    await agent_call(node, link.commit(key))
                except BindError:
                    await give_back(self._cache, node, lease.lease_id, undo)
                    raise
            await self._place(pod, node, lease, turn, undo=undo)

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
                with link_closed_fails(node):
                    return await ask(pod_request_id(uid, attempt))
            except grpc.aio.AioRpcError as exc:
                if not ended_request_id(exc):
                    raise BindError(refused_by(node, exc)) from exc
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


def _fields(pod: Obj, ask: PodAsk) -> dict[str, Any]:
    """The agent request for the pod (:func:`request_fields`), with the share's UID when it
    states one."""
    fields = request_fields(pod, ask)
    if ask.run_as_uid is not None:
        fields["run_as_uid"] = ask.run_as_uid
    return fields
