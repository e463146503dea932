"""The one adapter of the Kubernetes ports (:class:`agent.kubeapi.port.KubeApi` for the
cluster side, :class:`agent.kubeapi.port.ResourceApi` for the DRA driver): the endpoints
of ``CoreV1Api``, ``DiscoveryV1Api``, ``CoordinationV1Api`` and ``ResourceV1Api`` over one
:class:`~agent.kubeapi.connection.ApiConnection`, which decodes the answers and turns the
statuses into the port's exceptions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import replace

from kubernetes_asyncio.client import NodeV1Api

from agent.kubeapi.connection import PATCH_CONTENT_TYPES, ApiConnection, listing_of, selectors
from agent.kubeapi.port import Listing, Obj, PatchKind, WatchEvent

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def paging(limit: int, continue_token: str) -> dict[str, int | str]:
    """The query of one page of a list (none without a limit or a token)."""
    query: dict[str, int | str] = {"limit": limit} if limit > 0 else {}
    if continue_token:
        query["_continue"] = continue_token  # the generated client's name for ``continue``
    return query


def page_of(listed: Obj) -> Listing:
    """A list (or one page of it): its items, its resourceVersion, the next page's token."""
    meta = listed.get("metadata") or {}
    remaining = meta.get("remainingItemCount")
    return replace(
        listing_of(listed),
        continue_token=str(meta.get("continue") or ""),
        remaining_items=remaining if isinstance(remaining, int) else None,
    )


class RestKubeApi(ApiConnection):
    """The port's endpoints (:class:`~agent.kubeapi.port.KubeApi`, and
    :class:`~agent.kubeapi.port.ResourceApi` for the DRA driver) over one connection."""

    # -- the port --------------------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> Obj:
        return await self._call(self._core().read_namespaced_pod, name, namespace)

    async def list_pods(self, *, field_selector: str = "", label_selector: str = "") -> Listing:
        listed = await self._call(
            self._core().list_pod_for_all_namespaces, **selectors(field_selector, label_selector)
        )
        return listing_of(listed)

    def watch_pods(
        self, resource_version: str, *, field_selector: str = "", timeout_s: float = 300.0
    ) -> AsyncIterator[WatchEvent]:
        """Every change after ``resource_version`` until the server ends the watch after
        ``timeout_s`` (then the iterator ends). BOOKMARKs are asked for and passed on."""
        return self._watch(
            self._core().list_pod_for_all_namespaces,
            resource_version,
            timeout_s,
            b"",
            **selectors(field_selector, ""),
        )

    async def patch_pod(
        self, namespace: str, name: str, patch: Obj | list[Obj], *, kind: PatchKind = "merge"
    ) -> Obj:
        return await self._call(
            self._core().patch_namespaced_pod,
            name,
            namespace,
            patch,
            _content_type=PATCH_CONTENT_TYPES[kind],
        )

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        node_name: str,
        *,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        metadata: Obj = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid  # a precondition: a new pod of the same name is not bound
        if annotations:
            metadata["annotations"] = dict(annotations)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
        }
        await self._call(self._core().create_namespaced_pod_binding, name, namespace, binding)

    async def delete_pod(self, namespace: str, name: str, *, uid: str) -> None:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._call(self._core().delete_namespaced_pod, name, namespace, body=options)

    async def patch_node(self, name: str, patch: Obj) -> Obj:
        return await self._call(
            self._core().patch_node, name, patch, _content_type=PATCH_CONTENT_TYPES["merge"]
        )

    async def patch_node_status(self, name: str, patch: Obj) -> Obj:
        return await self._call(
            self._core().patch_node_status,
            name,
            patch,
            _content_type=PATCH_CONTENT_TYPES["strategic"],
        )

    async def create_event(self, namespace: str, event: Obj) -> None:
        await self._call(self._core().create_namespaced_event, namespace, event)

    async def list_endpoint_slices(self, namespace: str, service: str) -> list[Obj]:
        listed = await self._call(
            self._discovery().list_namespaced_endpoint_slice,
            namespace,
            label_selector=f"{SERVICE_NAME_LABEL}={service}",
        )
        return list(listed.get("items") or [])

    async def get_lease(self, namespace: str, name: str) -> Obj:
        return await self._call(self._coordination().read_namespaced_lease, name, namespace)

    async def create_lease(self, namespace: str, lease: Obj) -> Obj:
        return await self._call(self._coordination().create_namespaced_lease, namespace, lease)

    async def replace_lease(self, namespace: str, name: str, lease: Obj) -> Obj:
        return await self._call(
            self._coordination().replace_namespaced_lease, name, namespace, lease
        )

    # -- resource.k8s.io/v1 (the DRA driver) -------------------------------------------------

    async def get_node(self, name: str) -> Obj:
        return await self._call(self._core().read_node, name)

    async def list_resource_slices(self, *, field_selector: str = "") -> Listing:
        listed = await self._call(
            self._resource().list_resource_slice, **selectors(field_selector, "")
        )
        return listing_of(listed)

    async def create_resource_slice(self, body: Obj) -> Obj:
        return await self._call(self._resource().create_resource_slice, body)

    async def replace_resource_slice(self, name: str, body: Obj) -> Obj:
        return await self._call(self._resource().replace_resource_slice, name, body)

    async def delete_resource_slice(self, name: str, *, uid: str = "") -> None:
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}
        await self._call(self._resource().delete_resource_slice, name, body=options)

    async def get_resource_claim(self, namespace: str, name: str) -> Obj:
        return await self._call(self._resource().read_namespaced_resource_claim, name, namespace)

    async def list_resource_claims(
        self,
        *,
        field_selector: str = "",
        namespace: str = "",
        limit: int = 0,
        continue_token: str = "",
    ) -> Listing:
        query = {**selectors(field_selector, ""), **paging(limit, continue_token)}
        if namespace:
            listed = await self._call(
                self._resource().list_namespaced_resource_claim, namespace, **query
            )
        else:
            listed = await self._call(
                self._resource().list_resource_claim_for_all_namespaces, **query
            )
        return page_of(listed)

    def watch_resource_claims(
        self, resource_version: str, *, timeout_s: float = 300.0, mentioning: str = ""
    ) -> AsyncIterator[WatchEvent]:
        return self._watch(
            self._resource().list_resource_claim_for_all_namespaces,
            resource_version,
            timeout_s,
            mentioning.encode(),
        )

    async def replace_resource_claim_status(self, namespace: str, name: str, body: Obj) -> Obj:
        return await self._call(
            self._resource().replace_namespaced_resource_claim_status, name, namespace, body
        )

    # -- node.k8s.io/v1 (gpushare doctor) --------------------------------------------------

    async def get_runtime_class(self, name: str) -> Obj:
        return await self._call(NodeV1Api(self._clients()[0]).read_runtime_class, name)
