"""The gangs being bound (see :mod:`agent.kube.binder`): all or nothing up to the commit.

Each member's bind reserves on its node; the last one to be reserved commits the gang:
the members go in their nodes' lines (oldest lease first) right after the pod admitted
last there, and once that pod is allocated the gang is committed on every node. A gang
not complete within its TTL is aborted. If the commit fails on one node after it
succeeded on another, the members committed there are released (an abort ends only
reservations): none of the gang keeps a lease its retry would bind alone.

A gang settled (committed, or failed) is not joined again: a new member starts a new gang
of the same name. The members of a committed gang are remembered, so that one bound again
(its Binding failed) is known as such.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.kube.agents import AgentLink
from agent.kube.cache import AgentCache
from agent.kube.calls import BindError, agent_call, give_back, link_closed_fails
from agent.kube.line import Lines, Turn

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
        admitted last there, wait until that pod is allocated, then commit on every node.

        The members were reserved before that pod was admitted, so once committed they
        are older than its lease: the agent hands the next Allocate the oldest admitted
        lease not yet allocated, and that pod's Allocate would get a member's lease. The
        pods still waiting in the line are not admitted yet: they go after the members.
        If the commit fails, the members leave the lines at once, and those committed
        where it had succeeded are released."""
        by_node: dict[str, list[pb.Lease]] = {}
        for node, lease in sorted(gang.members.values(), key=lambda m: m[1].created_at):
            by_node.setdefault(node, []).append(lease)
        for node, leases in by_node.items():
            turns = self._lines.new_turns(node, len(leases), gang=True)
            gang.turns.update(zip((x.lease_id for x in leases), turns, strict=True))
        committed: list[str] = []
        try:
            for node, leases in sorted(by_node.items()):
                await self._lines.wait(node, gang.turns[leases[0].lease_id])
            for node in sorted(by_node):  # a commit that fails is FAILED_PRECONDITION
                await agent_call(node, self._link(node).commit(gang.key))
                committed.append(node)
            self._remember(gang)
        except BindError as exc:
            gang.failed = str(exc)
            await self.abort(gang)
            await self._release({node: by_node[node] for node in committed})
        finally:
            if gang.failed:
                for node, leases in by_node.items():
                    for lease in leases:
                        self._lines.end(node, gang.turns[lease.lease_id], "")
            gang.done.set()

    def _remember(self, gang: Gang) -> None:
        for uid in gang.members:
            self._committed[uid] = gang.key
        while len(self._committed) > COMMITTED_KEPT:
            del self._committed[next(iter(self._committed))]

    async def _release(self, by_node: dict[str, list[pb.Lease]]) -> None:
        """A gang's leases committed on these nodes before its commit failed elsewhere."""
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
                    "gang %s: abort on %s failed (its TTL ends it): %s", gang.key, node, exc
                )

    def _link(self, node: str) -> AgentLink:
        link = self._cache.link(node)
        if link is None:
            raise BindError(f"{node}: {self._cache.why_unknown(node)}")
        return link
