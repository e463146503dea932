"""Leases kept for a pod's next try (see :mod:`agent.legacy.cluster.binder`).

A bind whose Binding's outcome is not known keeps its lease instead of guessing: the pod
may be bound with it. Its turn in the node's line ended with the lease (the next pod waits
for its allocation, or its hold). The pod's next try takes the kept turn's place in the
line and gets the same lease (same request id). Once the pod is known to be bound with the
lease, the lease is forgotten here (in use); bound elsewhere, or gone, it is given back,
and the turn waiting for it waits no more. A bounded map, by pod UID.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial

from agent.legacy.cluster.cache import AgentCache
from agent.legacy.cluster.calls import give_back
from agent.legacy.cluster.line import Lines, Turn

log = logging.getLogger(__name__)

KEPT = 10_000  # pods with a lease kept for their next try, at most


@dataclass(frozen=True, slots=True)
class Kept:
    """A lease kept for a pod's next try: its Binding's outcome was not known."""

    node: str
    lease_id: str
    turn: Turn


class KeptLeases:
    def __init__(self, cache: AgentCache, lines: Lines) -> None:
        self._cache = cache
        self._lines = lines
        self._kept: dict[str, Kept] = {}  # pod uid -> its kept lease, newest last

    def __contains__(self, uid: object) -> bool:
        return uid in self._kept

    def get(self, uid: str) -> Kept | None:
        return self._kept.get(uid)

    def keep(self, uid: str, kept: Kept) -> None:
        self._kept.pop(uid, None)
        self._kept[uid] = kept
        while len(self._kept) > KEPT:
            del self._kept[next(iter(self._kept))]

    def forget(self, uid: str, lease_id: str) -> None:
        """The lease kept for the pod is given back by its bind."""
        kept = self._kept.get(uid)
        if kept is not None and kept.lease_id == lease_id:
            del self._kept[uid]

    def turn(self, uid: str, node: str) -> Turn:
        """A turn for a pod whose lease was granted before this try (kept for it, or its
        gang's): in the place of its last turn on ``node`` if that one kept the lease,
        else ahead of the pods not admitted yet."""
        kept = self._kept.get(uid)
        return self._lines.rejoin(
            node, kept.turn if kept is not None and kept.node == node else None
        )

    async def settle(self, uid: str, placement: tuple[str, str] | None) -> None:
        """The pod is now known to be gone (None) or placed: (node, lease annotation),
        ("", "") when unbound. A lease kept for it is forgotten if the pod is bound with it
        (no annotation: bound there, the lease is its own, as the controller reads it),
        left for its next try while it is unbound, else given back."""
        kept = self._kept.get(uid)
        if kept is None or (placement is not None and placement[0] == ""):
            return
        del self._kept[uid]
        if placement is not None and placement in ((kept.node, ""), (kept.node, kept.lease_id)):
            return  # bound with it: in use
        link = self._cache.link(kept.node)
        if link is None:  # the controller's reconcile releases it; the line waits its hold
            log.warning("lease %s kept on %s not given back: no agent", kept.lease_id, kept.node)
            return
        release = partial(link.release, kept.lease_id)
        if await give_back(self._cache, kept.node, kept.lease_id, release):
            self._lines.line(kept.node).gave_back(kept.turn)  # the next need not wait for it
