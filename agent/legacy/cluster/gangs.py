"""The gangs being bound (see :mod:`agent.legacy.cluster.binder`): all or nothing up to the commit.

Each member's bind reserves on its node; the last one to be reserved commits the gang:
the members go in their nodes' lines (oldest lease first) right after the pod admitted
last there, and once that pod is allocated the gang is committed on every node. A gang
not complete within its TTL is aborted. If the commit fails on one node (refused, or its
answer lost) after it was sent to others, the members of every node it was sent to are
released (an abort ends only reservations): none of the gang keeps a lease its retry
would bind alone.

A gang settled (committed, or failed) is not joined again: a new member starts a new gang
of the same name. A member bound again (its Binding failed) is known as such from the
members committed here (remembered), or from the agents' leases of the gang (after a
restart of this process): it is committed alone, in its turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.core.lease import LeaseState
from agent.kubeapi.port import Obj
from agent.legacy.cluster.bounded import printable
from agent.legacy.cluster.cache import AgentCache
from agent.legacy.cluster.calls import (
    BindError,
    agent_call,
    give_back,
    link_closed_fails,
    link_of,
    unbroken,
)
from agent.legacy.cluster.line import Lines, Turn

log = logging.getLogger(__name__)

COMMITTED_KEPT = 10_000  # members of committed gangs remembered


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


class Gangs:
    """The gangs by key (``<namespace>/<gang>``); iterating gives the keys."""

    def __init__(
        self, cache: AgentCache, lines: Lines, *, ttl_s: float, clock: Callable[[], float]
    ) -> None:
        self._cache = cache
        self._lines = lines
        self._ttl_s = ttl_s
        self._clock = clock
        self._gangs: dict[str, Gang] = {}
        self._committed: dict[str, str] = {}  # pod uid -> the gang it was committed with

    def __iter__(self) -> Iterator[str]:
        return iter(self._gangs)

    def committed_with(self, uid: str) -> str:
        """The gang the pod was committed with ("" for none known)."""
        return self._committed.get(uid, "")

    def running(self, key: str, pod: Obj) -> bool:
        """Whether members of gang ``key`` other than ``pod`` hold committed leases on the
        agents (as their last answers show), reserved no earlier than a gang TTL before
        ``pod`` was created: the gang was committed in ``pod``'s round, by this process or
        one before it, and ``pod`` is a member bound again (its lease given back after a
        failed Binding). Leases of an older round (a gang made anew while its old members
        still end) are not ``pod``'s gang's."""
        meta = pod.get("metadata") or {}
        created = _seconds(meta.get("creationTimestamp"))
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        if created is None:
            return False
        since = created - self._ttl_s
        for node in list(self._cache.nodes):
            for lease in self._cache.live_leases(node):
                committed = lease.state in (LeaseState.ADMITTED, LeaseState.READY)
                mine = lease.gang_id == key and lease.pod != name
                if mine and committed and lease.created_at >= since:
                    return True
        return False

    def join(self, key: str, size: int, uid: str, node: str, lease: pb.Lease) -> Gang:
        """The member's gang, with it: the one being formed, or a new one."""
        gang = self._gangs.get(key)
        if gang is None or gang.done.is_set():
            self._forget(self._clock())
            gang = self._gangs[key] = Gang(key, size, self._clock() + self._ttl_s)
        gang.members[uid] = (node, lease)
        return gang

    def _forget(self, now: float) -> None:
        """Drop gangs settled a TTL past their deadline (their members' binds are over)."""
        for key in [
            k for k, g in self._gangs.items() if g.done.is_set() and now > g.deadline + self._ttl_s
        ]:
            del self._gangs[key]

    async def wait(self, gang: Gang) -> None:
        """Until the gang is settled; at its deadline, with members missing, aborted."""
        left = gang.deadline - self._clock()
        try:
            await asyncio.wait_for(gang.done.wait(), max(left, 0.0))
        except TimeoutError:
            if gang.turns:  # the commit is under way: it ends (within the holds) either way
                await gang.done.wait()
            elif not gang.done.is_set():
                gang.failed = (
                    f"gang {gang.key}: {len(gang.members)} of {gang.size} members reserved "
                    f"within {self._ttl_s:.0f} s: aborted"
                )
                await self.abort(gang)
                gang.done.set()

    async def commit(self, gang: Gang) -> None:
        """Put the members in their nodes' lines (in lease age order) right after the pod
        admitted last there, wait until that pod is allocated on every node, start the
        gang's turns there (nothing goes ahead of them from then on), then commit on every
        node.

        The members were reserved before that pod was admitted, so once committed they
        are older than its lease: the agent hands the next Allocate the oldest admitted
        lease not yet allocated, and that pod's Allocate would get a member's lease. The
        pods still waiting in the line are not admitted yet: they go after the members.

        The commits are sent as one unit that a stop of ``kube serve`` does not cut. If
        one fails (refused, or its answer lost: it may have landed), or admits on a node
        fewer members than were reserved there, the gang fails: its reservations are
        aborted, the members of every node a commit was sent to are released, and they
        leave the lines."""
        by_node: dict[str, list[pb.Lease]] = {}
        for node, lease in sorted(gang.members.values(), key=lambda m: m[1].created_at):
            by_node.setdefault(node, []).append(lease)
        for node, leases in by_node.items():
            turns = self._lines.new_turns(node, len(leases), gang=True)
            gang.turns.update(zip((x.lease_id for x in leases), turns, strict=True))
        firsts = {node: gang.turns[leases[0].lease_id] for node, leases in by_node.items()}
        try:
            await self._wait_all(firsts)
        except BaseException as exc:  # cancelled while it waited: nothing was committed
            gang.failed = f"gang {gang.key}: not committed: {type(exc).__name__}"
            await unbroken(self.abort(gang))
            raise
        try:
            for node, first in firsts.items():  # from here nothing goes ahead of the gang
                self._lines.line(node).start(first)
            await unbroken(self._commit_everywhere(gang, by_node))
        finally:
            if gang.failed:
                for node, leases in by_node.items():
                    for lease in leases:
                        self._lines.end(node, gang.turns[lease.lease_id], "")
            gang.done.set()

    async def _wait_all(self, firsts: dict[str, Turn]) -> None:
        """Until the gang's first turn on every node has waited its turn, all at once: a
        pod that took a place ahead of one of them meanwhile (a retry in the place of its
        kept turn) is waited for too, before any is started."""
        while True:
            for node in sorted(firsts):
                await self._lines.wait(node, firsts[node])
            if not any(first.moved.is_set() for first in firsts.values()):
                return

    async def _commit_everywhere(self, gang: Gang, by_node: dict[str, list[pb.Lease]]) -> None:
        sent: list[str] = []  # nodes whose commit may have landed
        try:
            for node in sorted(by_node):  # a commit that fails is FAILED_PRECONDITION
                sent.append(node)
                answer = await agent_call(node, link_of(self._cache, node).commit(gang.key))
                _check_whole(gang.key, node, by_node[node], answer)
            self._remember(gang)
        except Exception as exc:  # refused, unanswered, or a fault of this side: all undone
            gang.failed = str(exc) if isinstance(exc, BindError) else f"gang {gang.key}: {exc!r}"
            await self.abort(gang)
            await self._release({node: by_node[node] for node in sent})
            if not isinstance(exc, BindError):
                raise

    def _remember(self, gang: Gang) -> None:
        for uid in gang.members:
            self._committed[uid] = gang.key
        while len(self._committed) > COMMITTED_KEPT:
            del self._committed[next(iter(self._committed))]

    async def _release(self, by_node: dict[str, list[pb.Lease]]) -> None:
        """A failed gang's leases on the nodes its commit was sent to (committed there, or
        perhaps: the answer was lost)."""
        for node, leases in by_node.items():
            link = self._cache.link(node)
            for lease in leases:
                if link is None:
                    log.warning("lease %s on %s not released: no agent", lease.lease_id, node)
                    continue
                await give_back(
                    self._cache, node, lease.lease_id, partial(link.release, lease.lease_id)
                )

    async def abort(self, gang: Gang) -> None:
        for node in sorted({node for node, _ in gang.members.values()}):
            link = self._cache.link(node)
            if link is None:
                continue
            try:
                with link_closed_fails(node):
                    await link.abort(gang.key)
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "gang %s: abort on %s failed (its TTL ends it): %s %s",
                    gang.key,
                    node,
                    exc.code().name,
                    printable(exc.details() or ""),
                )


def _seconds(stamp: object) -> float | None:
    """An RFC 3339 timestamp of the API server (``2026-01-01T00:00:00Z``) in Unix seconds."""
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _check_whole(key: str, node: str, members: list[pb.Lease], answer: pb.GangResponse) -> None:
    """The commit on ``node`` admitted every member reserved there: the agent commits
    what is reserved at that moment, and a member whose reservation ended before (its
    round started anew) would be missing from the gang."""
    admitted = {x.lease_id for x in answer.leases if x.state in ("admitted", "ready")}
    missing = sorted(x.lease_id for x in members if x.lease_id not in admitted)
    if missing:
        raise BindError(
            f"gang {key}: the commit on {node} did not admit {', '.join(missing)}: its "
            "reservation ended first"
        )
