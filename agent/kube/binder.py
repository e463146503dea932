"""The extender's bind: the node's agent decides (``Admit``, or ``Reserve`` then
``Commit`` for a gang, with the pod UID as request id), then the pod is bound with its
lease as an annotation of the Binding (the API server copies a Binding's annotations onto
the pod, so the lease and the node are set in one write). Any failure gives back what was
taken (``Release``, ``Abort``) and leaves the pod unbound, so the scheduler tries again.

The kubelet's ``Allocate`` does not say which pod it is for; the agent pairs each with the
oldest lease of a pod not yet allocated. So each node has a line: a pod is admitted and
bound only once the pod before it in the line has been allocated by the kubelet (the
agent's ``lease.allocated`` event), its bind has failed, or its hold has expired
(``hold_s``; the agent skips holds older than that). A pod is admitted only when its turn
comes, so its hold starts just before its Binding, however long the line. A pairing that
still goes wrong is caught on the node by the PodResources check and refused at
PreStartContainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.core.lease import ENDED_REQUEST_ID_HINT
from agent.kube.annotations import AnnotationError, PodAsk, parse_ask
from agent.kube.cache import AgentCache
from agent.kube.line import Line, Turn, until_either
from agent.kube.port import Conflict, KubeApi, KubeError, NotFound, Obj
from agent.kube.views import lease_of, pod_request_id, request_fields
from agent.kubelet.port import LEASE_ANNOTATION

log = logging.getLogger(__name__)

MAX_REQUEST_IDS = 8  # request ids tried in one bind
ATTEMPTS_KEPT = 10_000

# the pod of this UID as an informer last saw it, or None (then it is read from the API)
PodLookup = Callable[[str], Obj | None]


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
    # after the commit: each member's place in its node's line, by lease id
    turns: dict[str, Turn] = field(default_factory=dict)


class BindError(Exception):
    """Why a pod was not bound (the sentence the scheduler shows)."""


class Binder:
    def __init__(
        self,
        api: KubeApi,
        cache: AgentCache,
        options: BindOptions = BindOptions(),
        *,
        pods: PodLookup | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._cache = cache
        self._options = options
        self._pods = pods
        self._clock = clock
        self._lines: dict[str, Line] = {}
        self._gangs: dict[str, Gang] = {}
        self._attempts: dict[str, int] = {}  # pod uid -> its request id's attempt, newest last
        self.queued: Counter[str] = Counter()  # node -> binds to it in progress or waiting

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind the pod to ``node`` under a lease; "" on success, else why not."""
        kept = None
        try:
            pod = await self._pod(namespace, name, uid)
            if uid and pod["metadata"].get("uid") != uid:
                return f"pod {namespace}/{name} is not the one scheduled (uid changed)"
            if bound := (pod.get("spec") or {}).get("nodeName"):
                # a bind sent again (its answer lost, or from a stale view of the pod): the
                # pod's lease is granted and in use; asking again, annotating or giving back
                # would touch it
                return "" if bound == node else f"pod {namespace}/{name} is bound to {bound}"
            ask = parse_ask(pod)
            kept = self._cache.keep_assumed(uid, node)  # counted while it waits its turn
            with self._queued(node):
                if ask.gang_id:
                    await self._bind_gang_member(pod, ask, node)
                else:
                    await self._bind_one(pod, ask, node)
        except (BindError, AnnotationError) as exc:
            log.info("bind %s/%s on %s: %s", namespace, name, node, exc)
            return str(exc)
        except NotFound:
            return f"pod {namespace}/{name} is gone"
        finally:  # its expected placement counted until now (the lease, if any, from now)
            if kept is not None:
                self._cache.forget_assumed(uid, only=kept)
        return ""

    async def _pod(self, namespace: str, name: str, uid: str) -> Obj:
        """The pod as the informer has it (no read per bind), else as the API has it. A
        stale view is safe: a pod bound meanwhile makes the Binding a 409, handled there."""
        known = self._pods(uid) if self._pods is not None and uid else None
        meta = (known or {}).get("metadata") or {}
        if known is not None and (meta.get("namespace"), meta.get("name")) == (namespace, name):
            return known
        return await self._api.get_pod(namespace, name)

    # -- one pod ---------------------------------------------------------------------------

    async def _bind_one(self, pod: Obj, ask: PodAsk, node: str) -> None:
        link = self._link(node)
        fields = request_fields(pod, ask)
        [turn] = self._new_turns(node, 1)
        async with self._turn_taken(node, turn):
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
        Binding's annotation; on any failure give the lease back and say why. The turn
        ends in every case, after the lease is given back: until then the agent may still
        hand it to the kubelet."""
        self._cache.add_pending(node, lease_of(lease))
        meta = pod["metadata"]
        bound_with = ""
        try:
            await self._api.bind_pod(
                meta["namespace"],
                meta["name"],
                meta["uid"],
                node,
                annotations={LEASE_ANNOTATION: lease.lease_id},
            )
            bound_with = lease.lease_id
        except Conflict as exc:
            if not await self._bound_already(meta, node):
                await self._give_back(node, lease, undo)
                raise BindError(f"binding to {node} failed: {exc}") from exc
        except KubeError as exc:
            await self._give_back(node, lease, undo)
            raise BindError(f"binding to {node} failed: {exc}") from exc
        finally:
            self._line(node).end(turn, bound_with, self._clock())

    async def _bound_already(self, meta: Obj, node: str) -> bool:
        """After a 409: the pod was bound to ``node`` already (a bind sent again, seen
        unbound by a stale view), so its lease is in use and stays."""
        try:
            pod = await self._api.get_pod(meta["namespace"], meta["name"])
        except KubeError:
            return False
        same = pod["metadata"].get("uid") == meta["uid"]
        return same and (pod.get("spec") or {}).get("nodeName") == node

    async def _give_back(self, node: str, lease: pb.Lease, undo: Callable[[], Any]) -> None:
        self._cache.drop_pending(node, lease.lease_id)
        try:
            await undo()
        except grpc.aio.AioRpcError as exc:  # the controller's reconcile ends it
            log.warning("lease %s not given back after a failed bind: %s", lease.lease_id, exc)

    @contextlib.asynccontextmanager
    async def _turn_taken(self, node: str, turn: Turn) -> AsyncIterator[None]:
        """Wait for ``turn``, start it, then run the body; if anything fails before the
        body placed the pod (:meth:`_place` ends the turn itself), the turn ends with
        nothing bound."""
        line = self._line(node)
        try:
            await self._wait_turn(node, turn)  # none to wait for outside a line (NRI)
            line.start(turn)  # started last either way: should the node lose NRI, the next waits
            yield
        except BaseException:
            line.end(turn, "", self._clock())
            raise

    async def _wait_turn(self, node: str, turn: Turn) -> None:
        """Until the turn before ``turn`` is over: its bind ended and, if it bound a pod,
        the kubelet allocated that pod's lease (at most ``hold_s`` for each). When a gang
        goes in ahead meanwhile, wait for its last member instead."""
        while (previous := turn.previous) is not None:
            turn.moved.clear()
            await self._wait_over(node, previous, turn.moved)
            if turn.previous is previous and not turn.moved.is_set():
                return

    async def _wait_over(self, node: str, previous: Turn, moved: asyncio.Event) -> None:
        hold_s = self._options.hold_s
        await until_either(previous.ended.wait(), moved, hold_s)
        if moved.is_set():
            return
        if not previous.ended.is_set():
            log.warning("the bind before this one on %s did not end within %.0f s", node, hold_s)
            return
        if not previous.lease_id:
            return
        left_s = max(hold_s - (self._clock() - previous.ended_at), 0.0)
        allocated = self._cache.wait_allocated(node, previous.lease_id, left_s)
        if not await until_either(allocated, moved, left_s + 1.0) and not moved.is_set():
            log.warning(
                "lease %s on %s was not allocated within %.0f s", previous.lease_id, node, hold_s
            )

    # -- gangs -----------------------------------------------------------------------------

    async def _bind_gang_member(self, pod: Obj, ask: PodAsk, node: str) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{ask.gang_id}"
        gang = self._gangs.get(key)
        if gang is None or (gang.done.is_set() and gang.failed):
            self._forget_gangs(self._clock())
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
        turn = gang.turns[answer.lease.lease_id]
        lease_id = answer.lease.lease_id
        async with self._turn_taken(node, turn):
            await self._place(pod, node, answer.lease, turn, undo=lambda: link.release(lease_id))

    def _forget_gangs(self, now: float) -> None:
        """Drop gangs settled a TTL past their deadline (their members' binds are over)."""
        ttl_s = self._options.gang_ttl_s
        for key in [
            k for k, g in self._gangs.items() if g.done.is_set() and now > g.deadline + ttl_s
        ]:
            del self._gangs[key]

    async def _wait_gang(self, gang: Gang) -> None:
        left = gang.deadline - self._clock()
        try:
            await asyncio.wait_for(gang.done.wait(), max(left, 0.0))
        except TimeoutError:
            if gang.turns:  # the commit is under way: it ends (within the holds) either way
                await gang.done.wait()
            elif not gang.done.is_set():
                gang.failed = (
                    f"gang {gang.key}: {len(gang.members)} of {gang.size} members reserved "
                    f"within {self._options.gang_ttl_s:.0f} s: aborted"
                )
                await self._abort(gang)
                gang.done.set()

    async def _commit(self, gang: Gang) -> None:
        """Put the members in their nodes' lines (in lease age order) right after the pod
        admitted last there, wait until that pod is allocated, then commit on every node.

        The members were reserved before that pod was admitted, so once committed they
        are older than its lease: the agent hands the next Allocate the oldest admitted
        lease not yet allocated, and that pod's Allocate would get a member's lease. The
        pods still waiting in the line are not admitted yet: they go after the members.
        If the commit fails, the members leave the lines at once."""
        by_node: dict[str, list[pb.Lease]] = {}
        for node, lease in sorted(gang.members.values(), key=lambda m: m[1].created_at):
            by_node.setdefault(node, []).append(lease)
        for node, leases in by_node.items():
            turns = self._new_turns(node, len(leases), gang=True)
            gang.turns.update(zip((x.lease_id for x in leases), turns, strict=True))
        try:
            for node, leases in sorted(by_node.items()):
                await self._wait_turn(node, gang.turns[leases[0].lease_id])
            for node in sorted(by_node):  # a commit that fails is FAILED_PRECONDITION
                await _agent_call(node, self._link(node).commit(gang.key))
        except BindError as exc:
            gang.failed = str(exc)
            await self._abort(gang)
        finally:
            if gang.failed:
                for node, leases in by_node.items():
                    for lease in leases:
                        self._line(node).end(gang.turns[lease.lease_id], "", self._clock())
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

    def _new_turns(self, node: str, count: int, *, gang: bool = False) -> list[Turn]:
        """Places for binds to ``node``: at the end of its line (a gang's ahead of the pods
        waiting), or in no line, waiting for no other, when its agent's NRI plugin is
        registered with the runtime (it gives each container its own pod's lease)."""
        if self._cache.injector(node) == "nri":
            return [Turn(gang=gang) for _ in range(count)]
        line = self._line(node)
        return line.join_front(count) if gang else [line.join() for _ in range(count)]

    def _line(self, node: str) -> Line:
        return self._lines.setdefault(node, Line())

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
