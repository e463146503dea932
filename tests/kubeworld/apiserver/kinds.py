"""Every kind the stand-in serves, by its resource name (``pods``, ``resourceclaims``, ...),
gathered from the API groups' modules."""

from __future__ import annotations

from tests.kubeworld.apiserver.apps import DAEMON_SETS
from tests.kubeworld.apiserver.coordination import LEASES
from tests.kubeworld.apiserver.core import EVENTS, NODES, PODS
from tests.kubeworld.apiserver.discovery import SLICES
from tests.kubeworld.apiserver.objects import Kind
from tests.kubeworld.apiserver.resource import DRA_KINDS

KINDS: dict[str, Kind] = {
    k.resource: k for k in (PODS, NODES, EVENTS, SLICES, LEASES, DAEMON_SETS, *DRA_KINDS)
}
