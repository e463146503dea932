"""What every agent holds, kept current without a call per pod: one ``GetNode`` at
connect, then ``WatchEvents``, and a ``GetNode`` at least every ``HEARTBEAT_S``.

The events this side can account for make no call: a lease that ended (released, expired,
evicted, failed) stops counting at its event, and the grant of a lease to one of this
side's binds is counted from the bind's answer (it stays pending until an answer shows
it), as is an allocation, which moves no capacity. Any other event (a lease granted to
another caller, a gang's commit, a device's change) makes one more ``GetNode`` after its
burst (coalesced, ledger only). Two pods filtered at once never both count on the same
free memory. The last answer itself is kept as the agent gave it: what needs an agent's own
word (the leaseless pods) reads it, not the events since."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import grpc

from agent.admission.policy import DeviceView
from agent.api.proto import agent_pb2 as pb
from agent.core.lease import Lease, LeaseState
from agent.legacy.cluster.agents import AgentLink, Connect
from agent.legacy.cluster.views import device_views, lease_of, pod_uid_of

log = logging.getLogger(__name__)

Assumed = tuple[str, str, float]  # a pod's assumed placement: node, lease id, until

ALLOCATED = "lease.allocated"  # the agent's event when the kubelet allocated a lease
ENDED = frozenset(f"lease.{state.value}" for state in LeaseState if state.is_terminal)
GRANTED = frozenset({"lease.admitted", "lease.reserved"})  # what a bind's answer may show
COALESCE_S = 0.02
RETRY_MAX_S = 5.0
HEARTBEAT_S = 5.0  # the longest a dead agent's node is decided on from its last answer
ASSUMED_S = 5.0  # how long a pod's expected placement counts without its bind
ALLOCATED_KEPT = 10_000


@dataclass
class NodeEntry:
    node_name: str
    target: str
    link: AgentLink | None = None
    snapshot: pb.GetNodeResponse | None = None
    error: str = "not connected yet"
    stale: bool = False  # the last GetNode failed: the snapshot is not to be decided on
    pending: dict[str, Lease] = field(default_factory=dict)
    ended: dict[str, int] = field(default_factory=dict)  # lease id -> seq, since the answer
    granted: dict[str, str] = field(default_factory=dict)  # lease id -> state, since it
    must_ask: bool = False  # an event since the answer that only the agent can account for
    allocated: dict[str, asyncio.Event] = field(default_factory=dict)
    allocated_ids: dict[str, None] = field(default_factory=dict)  # newest last, bounded
    dirty: asyncio.Event = field(default_factory=asyncio.Event)
    # the views of the last (snapshot, pending) seen, and the pod UIDs with a lease there
    views: tuple[object, int, list[DeviceView], frozenset[str]] | None = None
    shown: tuple[object, list[Lease]] | None = None  # the last answer's leases, converted
    pending_version: int = 0
    last_seq: int = 0  # the newest event seen: a stream that breaks resumes after it
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class AgentCache:
    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self.nodes: dict[str, NodeEntry] = {}
        # called with (node, event) for every event of every agent, as it comes
        self.listeners: list[Callable[[str, pb.Event], None]] = []
        self._assumed: dict[str, Assumed] = {}  # pod uid -> its assumed placement

    # -- membership ------------------------------------------------------------------------

    def set_targets(self, targets: Mapping[str, str]) -> None:
        """Follow these agents (node -> target): start new ones, stop gone or moved ones."""
        for node, entry in list(self.nodes.items()):
            if targets.get(node) != entry.target:
                self._stop(node)
        for node, target in targets.items():
            if node not in self.nodes:
                entry = NodeEntry(node, target)
                entry.task = asyncio.create_task(self._follow(entry), name=f"agent-{node}")
                self.nodes[node] = entry

    def _stop(self, node: str) -> None:
        entry = self.nodes.pop(node)
        if entry.task is not None:
            entry.task.cancel()

    async def aclose(self) -> None:
        tasks = [e.task for e in self.nodes.values() if e.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.nodes.clear()

    async def wait_ready(self, timeout_s: float) -> None:
        """Until every followed agent answered once (or ``timeout_s``)."""
        waits = [e.ready.wait() for e in self.nodes.values()]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)

    # -- what the extender reads -------------------------------------------------------------

    def views(self, node: str, *, without_request: str = "") -> list[DeviceView] | None:
        """The node as the rules see it (``without_request``: see :func:`device_views`)."""
        entry = self.nodes.get(node)
        if entry is None or entry.snapshot is None or entry.link is None or entry.stale:
            return None
        shown = _shown(entry)
        cached = entry.views
        if cached is None or cached[0] is not entry.snapshot or cached[1] != entry.pending_version:
            views = device_views(
                entry.snapshot, entry.pending.values(), ended=entry.ended, shown=shown
            )
            pods = frozenset(pod_uid_of(x.request_id) for v in views for x in v.leases)
            cached = entry.views = (entry.snapshot, entry.pending_version, views, pods)
        if without_request and without_request in cached[3]:
            return device_views(
                entry.snapshot,
                entry.pending.values(),
                without_request=without_request,
                ended=entry.ended,
                shown=shown,
            )
        return cached[2]

    def injector(self, node: str) -> str:
        """How leases reach the containers on ``node`` (GetNodeResponse.injector)."""
        entry = self.nodes.get(node)
        return entry.snapshot.injector if entry is not None and entry.snapshot else ""

    def why_unknown(self, node: str) -> str:
        entry = self.nodes.get(node)
        if entry is None:
            return "no gpushare agent runs on this node"
        return f"the gpushare agent at {entry.target} does not answer: {entry.error}"

    def link(self, node: str) -> AgentLink | None:
        entry = self.nodes.get(node)
        return entry.link if entry is not None else None

    def add_pending(self, node: str, lease: Lease) -> None:
        """A lease granted to a bind in flight: counted until an answer shows it or its
        end event comes (its pod's assumed placement, if any, gives way to it). One whose
        end came first (evicted at once) is not counted."""
        self.forget_assumed(pod_uid_of(lease.request_id))
        if (entry := self.nodes.get(node)) is not None and lease.lease_id not in entry.ended:
            entry.pending[lease.lease_id] = lease
            entry.pending_version += 1

    def live_leases(self, node: str) -> list[Lease]:
        """Every lease counted live on ``node``, each once: the last answer's, less those
        ended since, and the binds' not shown yet (pods' assumed placements aside)."""
        entry = self.nodes.get(node)
        if entry is None or entry.snapshot is None:
            return []
        shown = _shown(entry)
        skip = {x.lease_id for x in shown} | {lease_id for _, lease_id, _ in self._assumed.values()}
        return [
            *(x for x in shown if x.lease_id not in entry.ended),
            *(x for x in entry.pending.values() if x.lease_id not in skip),
        ]

    def assume(self, node: str, lease: Lease, *, until: float) -> None:
        """Count ``lease``, a pod's expected placement between its prioritize and its bind,
        on ``node`` until ``until`` (monotonic seconds), its bind's lease, or
        :meth:`forget_assumed`: pods decided at the same moment do not all count on the
        same free memory (kube-scheduler "assumes" a pod on its node the same way)."""
        uid = pod_uid_of(lease.request_id)
        self.forget_assumed(uid)
        if (entry := self.nodes.get(node)) is not None:
            entry.pending[lease.lease_id] = lease
            entry.pending_version += 1
            self._assumed[uid] = (node, lease.lease_id, until)

    def keep_assumed(self, pod_uid: str, node: str) -> Assumed | None:
        """The pod's bind began on ``node``: an assumption there holds until the bind ends
        (it may wait in the node's line longer than ``ASSUMED_S``); one elsewhere goes.
        The one kept, for :meth:`forget_assumed` at the bind's end."""
        assumed = self._assumed.get(pod_uid)
        if assumed is not None and assumed[0] != node:
            self.forget_assumed(pod_uid)
        elif assumed is not None:
            kept = self._assumed[pod_uid] = (node, assumed[1], math.inf)
            return kept
        return None

    def forget_assumed(self, pod_uid: str, *, only: Assumed | None = None) -> None:
        """Stop counting the pod's assumed placement (``only``: if it is still that one; a
        bind that ends late, its answer given up by the scheduler, leaves the assumption
        of the pod's next try alone)."""
        if only is not None and self._assumed.get(pod_uid) is not only:
            return
        if (assumed := self._assumed.pop(pod_uid, None)) is not None:
            node, lease_id, _ = assumed
            if (entry := self.nodes.get(node)) is not None:
                entry.pending.pop(lease_id, None)
                entry.pending_version += 1

    def expire_assumed(self, now: float) -> None:
        for uid in [uid for uid, (_, _, until) in self._assumed.items() if until <= now]:
            self.forget_assumed(uid)

    def drop_pending(self, node: str, lease_id: str) -> None:
        """A bind gave its lease back: the agent's answer says whether it is still live."""
        if (entry := self.nodes.get(node)) is not None:
            entry.pending.pop(lease_id, None)
            entry.pending_version += 1
            entry.must_ask = True
            entry.dirty.set()

    async def wait_allocated(self, node: str, lease_id: str, timeout_s: float) -> bool:
        """Until the agent reports the kubelet allocated ``lease_id`` (``lease.allocated``)
        or the lease ended (released, evicted, ...: nothing of it is left to allocate), or
        ``timeout_s``; False on timeout."""
        entry = self.nodes.get(node)
        if entry is None:
            return False
        if lease_id in entry.allocated_ids or lease_id in entry.ended:
            return True
        event = entry.allocated.setdefault(lease_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            entry.allocated.pop(lease_id, None)

    # -- following one agent -----------------------------------------------------------------

    async def _follow(self, entry: NodeEntry) -> None:
        delay = 0.1
        while True:
            try:
                async with self._connect(entry.target) as link:
                    await self._serve(entry, link)
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, OSError) as exc:
                entry.error = _why(exc)
                log.warning("agent on %s (%s): %s", entry.node_name, entry.target, entry.error)
            except Exception as exc:  # a bug must not leave the node decided on a frozen answer
                entry.error = _why(exc)
                log.exception(
                    "agent on %s (%s): following it failed", entry.node_name, entry.target
                )
            entry.link, entry.stale = None, True
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _serve(self, entry: NodeEntry, link: AgentLink) -> None:
        """Follow the agent until its stream or its refreshes fail (then reconnect)."""
        entry.snapshot = await link.get_node(ledger_only=True)
        entry.link, entry.error, entry.stale = link, "", False
        # a new answer: what the last connection's events said since its own is in it (or
        # the agent's state was wiped, its seqs begun again)
        entry.ended, entry.granted, entry.must_ask = {}, {}, False
        entry.pending_version += 1
        entry.ready.set()
        since = entry.snapshot.last_event_seq
        if 0 < entry.last_seq <= since:  # a stream that broke: what came meanwhile too
            since = entry.last_seq  # (a seq past the agent's last: its state was wiped)
        parts = {
            asyncio.create_task(self._refresh(entry, link), name=f"refresh-{entry.node_name}"),
            asyncio.create_task(self._events(entry, link, since), name=f"events-{entry.node_name}"),
        }
        try:
            done, _ = await asyncio.wait(parts, return_when=asyncio.FIRST_COMPLETED)
            for part in done:
                part.result()  # its failure ends this connection
        finally:
            for part in parts:
                part.cancel()
            await asyncio.gather(*parts, return_exceptions=True)

    async def _events(self, entry: NodeEntry, link: AgentLink, since: int) -> None:
        async for event in link.watch_events(since_seq=since):
            entry.last_seq = max(entry.last_seq, event.seq)
            for listener in self.listeners:
                try:
                    listener(entry.node_name, event)
                except Exception:  # a listener's bug must not stop this agent's stream
                    log.exception("event listener failed on %s", entry.node_name)
            if event.kind == ALLOCATED:  # the lease reached its container: no
                _remember(entry.allocated_ids, event.lease_id)  # capacity moved
                if waiter := entry.allocated.get(event.lease_id):
                    waiter.set()
                continue
            if event.kind in ENDED and event.lease_id:  # never live again: not counted now
                entry.pending.pop(event.lease_id, None)
                entry.ended[event.lease_id] = event.seq
                if waiter := entry.allocated.get(event.lease_id):
                    waiter.set()  # nothing of it is left for the kubelet to allocate
                entry.pending_version += 1
                continue
            if event.kind in GRANTED and event.lease_id:  # ("": another caller's, hidden)
                entry.granted[event.lease_id] = event.kind.removeprefix("lease.")
            else:
                entry.must_ask = True
            entry.dirty.set()

    async def _refresh(self, entry: NodeEntry, link: AgentLink) -> None:
        """A GetNode after each burst of events, and at least every ``HEARTBEAT_S``: the
        event stream retries a dead agent quietly, so an agent that stops answering is
        noticed here, and its node is unknown (not filtered on its last answer) until it
        answers again."""
        asked = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):  # (wait_for can lose a cancellation)
                async with asyncio.timeout(max(asked + HEARTBEAT_S - time.monotonic(), 0)):
                    await entry.dirty.wait()
            await asyncio.sleep(COALESCE_S)
            entry.dirty.clear()
            accounted = time.monotonic() < asked + HEARTBEAT_S and _accounted(entry)
            entry.granted.clear()
            if accounted:
                continue
            entry.must_ask = False
            started = asked = time.monotonic()
            try:
                snapshot = await link.get_node(ledger_only=True)
            except grpc.aio.AioRpcError as exc:
                entry.error = _why(exc)
                entry.stale = True
                if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
                    raise  # a rotated token: connect again with the one on disk now
                entry.must_ask = True
                entry.dirty.set()
                await asyncio.sleep(RETRY_MAX_S / 10)
                continue
            entry.snapshot, entry.stale, entry.error = snapshot, False, ""
            shown = {x.lease_id for x in snapshot.leases}
            for lease_id in [x for x in entry.pending if x in shown]:
                del entry.pending[lease_id]
            entry.ended = {k: s for k, s in entry.ended.items() if s > snapshot.last_event_seq}
            entry.pending_version += 1
            log.debug(
                "agent %s refreshed in %.1f ms", entry.node_name, 1e3 * (time.monotonic() - started)
            )


def _accounted(entry: NodeEntry) -> bool:
    """Every event since the last ask is one this side accounts for: the grant of a lease
    its bind holds, in the state it holds it (a gang's commit changes that state)."""
    if entry.must_ask:
        return False
    for lease_id, state in entry.granted.items():
        held = entry.pending.get(lease_id)
        if held is None or held.state.value != state:
            return False
    return True


def _shown(entry: NodeEntry) -> list[Lease]:
    """The last answer's leases, converted once per answer."""
    assert entry.snapshot is not None
    if entry.shown is None or entry.shown[0] is not entry.snapshot:
        entry.shown = (entry.snapshot, [lease_of(x) for x in entry.snapshot.leases])
    return entry.shown[1]


def _remember(ids: dict[str, None], lease_id: str) -> None:
    ids[lease_id] = None
    while len(ids) > ALLOCATED_KEPT:
        del ids[next(iter(ids))]


def _why(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__
