"""The calls the cluster side makes to the agents of the cluster, found through their
headless Service's EndpointSlices (:mod:`agent.kubeapi.endpoints`, shared with the DRA
path)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from agent.api.proto import agent_pb2 as pb
from agent.kubeapi.endpoints import GRPC_PORT_NAME, targets_from_slices

__all__ = ["GRPC_PORT_NAME", "AgentLink", "Connect", "targets_from_slices"]


class AgentLink(Protocol):
    """One agent, as :class:`agent.client.AgentClient` offers it."""

    target: str

    async def admit(self, **fields: Any) -> pb.AdmitResponse: ...

    async def reserve(
        self, gang_id: str, *, ttl_s: float = 0.0, **fields: Any
    ) -> pb.AdmitResponse: ...

    async def commit(self, gang_id: str) -> pb.GangResponse: ...

    async def abort(self, gang_id: str) -> pb.GangResponse: ...

    async def release(self, lease_id: str) -> pb.ReleaseResponse: ...

    async def get_node(self, *, ledger_only: bool = False) -> pb.GetNodeResponse: ...

    def watch_events(self, *, since_seq: int = 0) -> AsyncIterator[pb.Event]: ...


# target -> a link used inside ``async with`` (opens and closes the channel)
Connect = Callable[[str], AbstractAsyncContextManager[AgentLink]]
