"""discovery.k8s.io/v1: the EndpointSlices of a Service (list and watch; a test sets them)."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from functools import partial

from tests.kubeworld.apiserver.objects import Kind, Obj, copy_json

SLICES = Kind(
    "endpointslices",
    "EndpointSlice",
    "discovery.k8s.io/v1",
    True,
    frozenset({"metadata.name", "metadata.namespace", "addressType"}),
)


class DiscoveryV1:
    """The discovery.k8s.io/v1 part of :class:`FakeApiServer`."""

    def _discovery_routes(self) -> None:
        add = self.app.router.add_route
        for path in (
            "/apis/discovery.k8s.io/v1/endpointslices",
            "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        ):
            add("GET", path, partial(self._list, SLICES))

    def set_endpoints(
        self,
        namespace: str,
        service: str,
        endpoints: Iterable[tuple[str, str]],
        *,
        port: int,
        port_name: str = "grpc",
        ready: bool = True,
    ) -> Obj:
        """Replace the Service's one EndpointSlice: ``endpoints`` are (node name, address)."""
        name = f"{service}-{secrets.token_hex(3)[:5]}"
        for (ns, old_name), old in list(self.objects["endpointslices"].items()):
            if (
                ns == namespace
                and old["metadata"]["labels"].get("kubernetes.io/service-name") == service
            ):
                name = old_name
                self._commit(SLICES, "DELETED", old, copy_json(old))
        slice_: Obj = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
            },
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [address],
                    "conditions": {"ready": ready, "serving": ready, "terminating": False},
                    "nodeName": node,
                    "targetRef": {
                        "kind": "Pod",
                        "namespace": namespace,
                        "name": f"{service}-{node}",
                    },
                }
                for node, address in endpoints
            ],
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        }
        return self._insert(SLICES, namespace, slice_)
