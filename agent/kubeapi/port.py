"""The Kubernetes API as the agent's parts use it: the few endpoints they need, with
objects as the API server sends them (JSON dicts: ``metadata``, ``spec``, ``status``) and
its status codes as exceptions (:class:`Unanswered` when no answer came: the outcome of a
write is then unknown). One adapter implements it (:mod:`agent.kubeapi.rest`); tests run it
against a stand-in API server that speaks the same format."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from agent.core.errors import GpushareError

Obj = dict[str, Any]  # one Kubernetes object, as JSON
PatchKind = Literal["merge", "json", "strategic"]
WatchKind = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


class KubeError(GpushareError):
    """The API server answered with an error status (``status`` is its HTTP code)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason


class Unanswered(KubeError):
    """No answer came to a request that was sent, or may have been: it timed out, or its
    connection broke. What it asked may or may not have been done (``status`` 0, reason
    ``Unreachable``, as a request that could not be sent at all)."""


class NotFound(KubeError):
    """404: the object does not exist (or no longer does)."""


class Conflict(KubeError):
    """409: a stale resourceVersion, or the object already exists."""


class Gone(KubeError):
    """410: the watch's resourceVersion is too old; list again, then watch from there."""


@dataclass(frozen=True, slots=True)
class Listing:
    items: list[Obj]
    resource_version: str  # the list's: watch from here to miss nothing
    # a page of a list asked for with a limit: the token of the next page ("" on the
    # last), and how many items follow when the server says (it does without selectors)
    continue_token: str = ""
    remaining_items: int | None = None


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: WatchKind
    obj: Obj


class KubeApi(Protocol):
    async def get_pod(self, namespace: str, name: str) -> Obj: ...

    async def list_pods(self, *, field_selector: str = "", label_selector: str = "") -> Listing:
        """Pods of every namespace."""
        ...

    def watch_pods(
        self, resource_version: str, *, field_selector: str = "", timeout_s: float = 300.0
    ) -> AsyncIterator[WatchEvent]:
        """Changes after ``resource_version``; raises :class:`Gone` when it is too old."""
        ...

    async def patch_pod(
        self, namespace: str, name: str, patch: Obj | list[Obj], *, kind: PatchKind = "merge"
    ) -> Obj: ...

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        node_name: str,
        *,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """POST the pod's ``binding`` subresource (409 if it is bound already); the API
        server copies the Binding's ``annotations`` onto the pod in the same write."""
        ...

    async def delete_pod(self, namespace: str, name: str, *, uid: str) -> None:
        """Delete the pod gracefully; 409 if the pod of that name is another (``uid``)."""
        ...

    async def patch_node(self, name: str, patch: Obj) -> Obj:
        """Merge-patch a node (its labels)."""
        ...

    async def patch_node_status(self, name: str, patch: Obj) -> Obj:
        """Strategic-merge-patch a node's ``status`` subresource (its conditions)."""
        ...

    async def create_event(self, namespace: str, event: Obj) -> None: ...

    async def list_endpoint_slices(self, namespace: str, service: str) -> list[Obj]:
        """The EndpointSlices of a Service (label ``kubernetes.io/service-name``)."""
        ...

    async def get_lease(self, namespace: str, name: str) -> Obj:
        """A ``coordination.k8s.io/v1`` Lease (leader election)."""
        ...

    async def create_lease(self, namespace: str, lease: Obj) -> Obj:
        """Create a Lease; 409 if it exists."""
        ...

    async def replace_lease(self, namespace: str, name: str, lease: Obj) -> Obj:
        """PUT a Lease; 409 if its ``metadata.resourceVersion`` is not the stored one."""
        ...

    async def aclose(self) -> None: ...


class ResourceApi(Protocol):
    """``resource.k8s.io/v1`` as the DRA driver uses it: its node's ResourceSlices and the
    ResourceClaims allocated to its devices."""

    async def get_node(self, name: str) -> Obj: ...

    async def list_resource_slices(self, *, field_selector: str = "") -> Listing: ...

    async def create_resource_slice(self, body: Obj) -> Obj: ...

    async def replace_resource_slice(self, name: str, body: Obj) -> Obj:
        """PUT; 409 if its ``metadata.resourceVersion`` is not the stored one."""
        ...

    async def delete_resource_slice(self, name: str, *, uid: str = "") -> None:
        """Delete; 409 if the slice of that name is another (``uid``)."""
        ...

    async def get_pod(self, namespace: str, name: str) -> Obj:
        """A pod (the claim reconcile reads the claims' names of a lease's pod)."""
        ...

    async def get_resource_claim(self, namespace: str, name: str) -> Obj: ...

    async def list_resource_claims(
        self,
        *,
        field_selector: str = "",
        namespace: str = "",
        limit: int = 0,
        continue_token: str = "",
    ) -> Listing:
        """Claims of ``namespace``; of every namespace when it is "". With ``limit`` (> 0),
        one page of at most that many, and the next page's ``continue_token`` in the
        listing ("" on the last); every page of one list has the first page's
        resourceVersion. A token whose version the server forgot raises :class:`Gone`:
        list again from the first page."""
        ...

    def watch_resource_claims(
        self, resource_version: str, *, timeout_s: float = 300.0, mentioning: str = ""
    ) -> AsyncIterator[WatchEvent]:
        """Changes after ``resource_version``; raises :class:`Gone` when it is too old. With
        ``mentioning``, a change whose JSON does not contain that text comes as a BOOKMARK
        with its resourceVersion only (the claims of other nodes, undecoded)."""
        ...

    async def replace_resource_claim_status(self, namespace: str, name: str, body: Obj) -> Obj:
        """PUT the ``status`` subresource; 409 on a stale ``metadata.resourceVersion``."""
        ...

    async def aclose(self) -> None: ...


class DaemonSetApi(Protocol):
    """``apps/v1`` DaemonSets of one namespace as the uninstall hook uses them
    (``gpushare kube wait-rollout``): read one, delete one, list the pods it selects."""

    async def get_daemon_set(self, namespace: str, name: str) -> Obj: ...

    async def delete_daemon_set(self, namespace: str, name: str, *, propagation: str) -> None:
        """Delete it with ``propagationPolicy`` ``propagation`` (Background, Foreground,
        Orphan); :class:`NotFound` if it is gone already."""
        ...

    async def list_namespaced_pods(
        self, namespace: str, *, label_selector: str = ""
    ) -> Listing: ...

    async def aclose(self) -> None: ...


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    metadata = obj.get("metadata") or {}
    return metadata.get("annotations") or {}


ENDED_PHASES = ("Succeeded", "Failed")


def ended(pod: Mapping[str, Any]) -> bool:
    """Being deleted, or its phase is final: no container of it will start again."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return bool(meta.get("deletionTimestamp")) or status.get("phase") in ENDED_PHASES
