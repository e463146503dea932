"""The agent's kubelet device plugin, when ``kubelet.enabled``: wired here so the app
only starts and stops it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from agent.config import Settings
from agent.kubelet.plugin import DevicePluginServer
from agent.kubelet.podresources import PodResourcesClient, PodResourcesError
from agent.kubelet.port import DEFAULT_RESOURCE_NAME as RESOURCE
from agent.kubelet.port import AllocationRefused
from agent.runtime.events import EventLog
from agent.runtime.node import NodeService
from agent.runtime.podalloc import PodAllocator, PodOfUnits

log = logging.getLogger(__name__)


def pod_lookup(client: PodResourcesClient) -> PodOfUnits:
    """The pod whose container holds these share units, per the kubelet's PodResources."""

    async def pod_of_units(units: Sequence[str]) -> str | None:
        try:
            assigned = await client.list()
        except PodResourcesError as exc:
            raise AllocationRefused(f"cannot check the allocation with the kubelet: {exc}") from exc
        wanted = set(units)
        for entry in assigned:
            if wanted <= set(entry.device_ids):
                return f"{entry.namespace}/{entry.pod}"
        return None

    return pod_of_units


async def start_device_plugin(
    settings: Settings, node: NodeService, events: EventLog, *, clock: Callable[[], float]
) -> DevicePluginServer | None:
    k = settings.kubelet
    if not k.enabled:
        return None
    client = PodResourcesClient(k.pod_resources_socket, resource_name=RESOURCE)
    allocator = PodAllocator(node, events, k, pod_of_units=pod_lookup(client), clock=clock)
    server = DevicePluginServer(allocator, resource_name=RESOURCE, plugin_dir=k.plugin_dir)
    await server.start()
    log.info("kubelet device plugin for %s on %s (%d units)", RESOURCE, server.socket_path, k.slots)
    return server
