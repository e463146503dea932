"""At most so many asks at once to one node's agent. An agent that is slow or hung (each
``AnswerClaim`` may take the call's timeout, twice) then holds only its own node's slots:
the claims waiting for it wait here, holding nothing the other nodes' claims need (the
controller's global slots bound its API reads and writes, not its asks). One semaphore
per node with an ask waiting or running, dropped when the last one leaves: nodes that
are gone leave nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass
class _Node:
    slots: asyncio.Semaphore
    users: int = 0  # asks holding or waiting for a slot


class NodeSlots:
    def __init__(self, per_node: int) -> None:
        if per_node < 1:
            raise ValueError("per_node must be 1 or more")
        self.per_node = per_node
        self._nodes: dict[str, _Node] = {}

    def __len__(self) -> int:
        """Nodes with an ask waiting or running now."""
        return len(self._nodes)

    def busy(self, node: str) -> int:
        """Asks to ``node`` waiting or running now."""
        found = self._nodes.get(node)
        return found.users if found is not None else 0

    @contextlib.asynccontextmanager
    async def held(self, node: str) -> AsyncIterator[None]:
        """One of ``node``'s slots, held for the ``async with`` body."""
        entry = self._nodes.get(node)
        if entry is None:
            entry = self._nodes[node] = _Node(asyncio.Semaphore(self.per_node))
        entry.users += 1
        try:
            async with entry.slots:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._nodes[node]
