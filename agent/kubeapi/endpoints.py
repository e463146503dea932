"""The agents of the cluster, as both Kubernetes paths find them: the agents' headless
Service's EndpointSlices (``discovery.k8s.io/v1``) name one ready endpoint per node, its
address and the ``grpc`` port. Pure functions of the slices' JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

GRPC_PORT_NAME = "grpc"


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
