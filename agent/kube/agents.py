"""The agents of the cluster, found through their headless Service's EndpointSlices (one
endpoint per node: its address, its node name, the ``grpc`` port), and the calls the
cluster side makes to them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from agent.api.proto import agent_pb2 as pb

GRPC_PORT_NAME = "grpc"


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


def targets_from_slices(
    slices: Sequence[Mapping[str, Any]], *, port_name: str = GRPC_PORT_NAME
) -> dict[str, str]:
    """Node name -> ``host:port`` of the ready endpoints in EndpointSlices (discovery/v1).
    An endpoint without a node name, an address or the named port is skipped."""
    found: dict[str, str] = {}
    for item in slices:
        ports = [p for p in item.get("ports") or [] if p.get("name") == port_name]
        if not ports or not ports[0].get("port"):
            continue
        port = int(ports[0]["port"])
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            node, addresses = endpoint.get("nodeName"), endpoint.get("addresses") or []
            if node and addresses and conditions.get("ready", True) is not False:
                host = addresses[0]
                found[node] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return found
