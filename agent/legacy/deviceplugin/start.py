"""The agent's kubelet device plugin, when ``kubelet.enabled``, and its NRI plugin, when
``kubelet.nri_socket`` is set too: wired here so the app only starts and stops them. The
allocations made before a restart are read back before the plugin serves, and the node
tells the allocator of each grant it answers (a retried bind starts its hold again)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from agent.config import Settings
from agent.legacy.deviceplugin.kubelet.plugin import DevicePluginServer
from agent.legacy.deviceplugin.kubelet.podresources import PodResourcesClient, PodResourcesError
from agent.legacy.deviceplugin.kubelet.port import DEFAULT_RESOURCE_NAME as RESOURCE
from agent.legacy.deviceplugin.kubelet.port import AllocationRefused
from agent.legacy.deviceplugin.nri.plugin import NriPlugin
from agent.legacy.deviceplugin.podalloc import PodAllocator, PodOfUnits, SharedMemory
from agent.legacy.deviceplugin.records import AllocationStore
from agent.node.events import EventLog
from agent.node.service import NodeService

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


class KubeletPlugins:
    """The device plugin, and the NRI plugin beside it when one is configured."""

    def __init__(self, server: DevicePluginServer, allocator: PodAllocator) -> None:
        self.server = server
        self.allocator = allocator
        self._nri: asyncio.Task[None] | None = None

    @property
    def injector(self) -> str:
        return "nri" if self.allocator.nri_registered else "device-plugin"

    def start_nri(self, socket_path: str, events: EventLog) -> None:
        def changed(registered: bool) -> None:
            self.allocator.nri_registered = registered
            state = "registered with" if registered else "lost"
            events("kubelet.nri", f"NRI plugin {state} the runtime at {socket_path}")

        plugin = NriPlugin(socket_path, self.allocator.inject, on_change=changed)
        self._nri = asyncio.create_task(plugin.run(), name="nri-plugin")

    async def stop(self) -> None:
        if self._nri is not None:
            self._nri.cancel()
            await asyncio.gather(self._nri, return_exceptions=True)
        self.allocator.nri_registered = False
        await self.server.stop()


async def start_device_plugin(
    settings: Settings,
    node: NodeService,
    events: EventLog,
    *,
    store: AllocationStore,
    clock: Callable[[], float],
    shm: SharedMemory | None = None,
) -> KubeletPlugins | None:
    k = settings.kubelet
    if not k.enabled:
        return None
    client = PodResourcesClient(k.pod_resources_socket, resource_name=RESOURCE)
    allocator = PodAllocator(
        node, events, k, store=store, pod_of_units=pod_lookup(client), clock=clock, shm=shm
    )
    await allocator.load()
    node.on_granted = allocator.granted
    server = DevicePluginServer(allocator, resource_name=RESOURCE, plugin_dir=k.plugin_dir)
    await server.start()
    log.info("kubelet device plugin for %s on %s (%d units)", RESOURCE, server.socket_path, k.slots)
    plugins = KubeletPlugins(server, allocator)
    if k.nri_socket:
        plugins.start_nri(k.nri_socket, events)
    return plugins
