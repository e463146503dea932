"""The adapter of :class:`agent.kubeapi.port.DaemonSetApi` (the uninstall hook's ``gpushare
kube wait-rollout``): ``AppsV1Api``'s DaemonSet endpoints and the namespaced pod list, over
the same :class:`~agent.kubeapi.connection.ApiConnection` as :class:`~agent.kubeapi.rest.
RestKubeApi`, whose answers it decodes and whose errors it raises. Apart from the agent's
and the scheduler's calls (rest.py), which their RBAC grants: these are the hook's, which
its own Role grants (templates/hooks/pre-delete.yaml)."""

from __future__ import annotations

from kubernetes_asyncio.client import AppsV1Api

from agent.kubeapi.connection import listing_of, selectors
from agent.kubeapi.port import Listing, Obj
from agent.kubeapi.rest import RestKubeApi


class RestDaemonSetApi(RestKubeApi):
    async def get_daemon_set(self, namespace: str, name: str) -> Obj:
        return await self._call(self._apps().read_namespaced_daemon_set, name, namespace)

    async def delete_daemon_set(self, namespace: str, name: str, *, propagation: str) -> None:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        await self._call(self._apps().delete_namespaced_daemon_set, name, namespace, body=options)

    async def list_namespaced_pods(self, namespace: str, *, label_selector: str = "") -> Listing:
        listed = await self._call(
            self._core().list_namespaced_pod, namespace, **selectors("", label_selector)
        )
        return listing_of(listed)

    def _apps(self) -> AppsV1Api:
        return AppsV1Api(self._clients()[0])
