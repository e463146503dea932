"""coordination.k8s.io/v1: Leases (create, get, PUT)."""

from __future__ import annotations

from functools import partial

from tests.kubeworld.apiserver.objects import Kind

LEASES = Kind(
    "leases",
    "Lease",
    "coordination.k8s.io/v1",
    True,
    frozenset({"metadata.name", "metadata.namespace"}),
)


class CoordinationV1:
    """The coordination.k8s.io/v1 part of :class:`FakeApiServer`."""

    def _coordination_routes(self) -> None:
        add = self.app.router.add_route
        leases = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        add("POST", leases, partial(self._create, LEASES))
        add("GET", leases + "/{name}", partial(self._get, LEASES))
        add("PUT", leases + "/{name}", partial(self._replace, LEASES, ""))
