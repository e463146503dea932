"""A test kubelet that speaks the real kubelet gRPC APIs to a device plugin.

Laid out like a node's ``/var/lib/kubelet``: ``<root>/device-plugins/kubelet.sock`` serves
``v1beta1.Registration`` and ``<root>/pod-resources/kubelet.sock`` serves
``v1.PodResourcesLister``. It behaves as the kubelet's device manager does:

* Register checks the version and resource name, connects to ``<plugin dir>/<endpoint>``,
  calls GetDevicePluginOptions before answering, then keeps a ListAndWatch stream open
  in the background and the latest device list from it; when the stream ends, the
  plugin's devices are marked unhealthy. A second Register for a resource replaces the
  first plugin.
* ``allocate`` picks free healthy ids (through GetPreferredAllocation when the plugin
  offers it), calls Allocate, records the assignment, then calls PreStartContainer when
  the plugin asked for it. A refused Allocate records nothing (the pod fails admission);
  a refused PreStartContainer keeps the assignment (the container fails to start, the
  pod keeps its devices), as in the kubelet.
* When the device manager itself cannot allocate (no plugin registered for the resource,
  none of its devices healthy, as while the plugin is away or has just registered again
  and not yet listed its devices, or too few free), the pod is rejected at admission as
  the kubelet rejects it: the outcome fails at ``Allocate`` with the kubelet's
  ``UnexpectedAdmissionError`` sentence (:class:`AdmissionRejected`), the pod is Failed,
  nothing is retried (kubernetes/kubernetes#109595, #119248).
* ``restart`` does what a kubelet restart does to the plugin directory: its plugins are
  forgotten, their sockets removed, and a new ``kubelet.sock`` is created. Assignments
  survive, as they do in the kubelet's checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from agent.legacy.deviceplugin.kubelet.proto import deviceplugin_pb2 as dp
from agent.legacy.deviceplugin.kubelet.proto import deviceplugin_pb2_grpc as dp_grpc
from agent.legacy.deviceplugin.kubelet.proto import podresources_pb2 as pr
from agent.legacy.deviceplugin.kubelet.proto import podresources_pb2_grpc as pr_grpc

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
SUPPORTED_VERSIONS = ("v1beta1",)
RESOURCE = "gpushare.io/share"
Context = grpc.aio.ServicerContext[Any, Any]


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until ``predicate()`` holds, checking every few milliseconds (for state on the
    plugin's side, which tells the kubelet nothing when it changes)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


class FakeKubeletError(Exception):
    """The kubelet stand-in cannot do what a test asked."""


class AdmissionRejected(FakeKubeletError):
    """The kubelet's device manager rejected the pod before any plugin was called: the pod
    is Failed with this reason and message (``Pod was rejected: <message>``)."""

    reason = "UnexpectedAdmissionError"

    def __init__(self, cause: str) -> None:
        super().__init__(f"Allocate failed due to {cause}, which is unexpected")


@dataclass
class Plugin:
    """One registered device plugin, as the kubelet's device manager keeps it."""

    request: dp.RegisterRequest
    options: dp.DevicePluginOptions
    channel: grpc.aio.Channel
    stub: dp_grpc.DevicePluginStub
    devices: dict[str, str] = field(default_factory=dict)  # id -> health, in plugin order
    updates: int = 0  # ListAndWatch answers received
    task: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class Assignment:
    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass
class Outcome:
    """What one container's allocation came to: the ids picked, the plugin's answer, and
    the error of Allocate or PreStartContainer, or of the runtime's CreateContainer where
    an NRI plugin refused it (``failed_at`` names which)."""

    device_ids: list[str]
    response: dp.ContainerAllocateResponse | None = None
    error: Exception | None = None
    failed_at: str | None = None


class FakeKubelet(dp_grpc.RegistrationServicer, pr_grpc.PodResourcesListerServicer):
    def __init__(self, root: Path, *, rpc_timeout_s: float = 5.0) -> None:
        self.plugin_dir = root / "device-plugins"
        self.pod_resources_socket = root / "pod-resources" / "kubelet.sock"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self.rpc_timeout_s = rpc_timeout_s
        self.plugins: dict[str, Plugin] = {}
        self.register_requests: list[dp.RegisterRequest] = []  # every Register, in order
        self.preferred_requests: list[dp.PreferredAllocationRequest] = []
        self.assignments: list[Assignment] = []
        self.refuse_registrations = 0  # refuse this many Register calls, then accept
        self._registration: grpc.aio.Server | None = None
        self._pod_resources: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()
        # the kubelet admits one pod at a time: its device manager takes a container's ids
        # before it calls the plugin, so two pods never get the same unit
        self._admitting = asyncio.Lock()

    @property
    def socket(self) -> Path:
        return self.plugin_dir / "kubelet.sock"

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        await self._serve_registration()
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        await server.start()
        self._pod_resources = server

    async def stop(self) -> None:
        await self._stop_registration()
        if self._pod_resources is not None:
            await self._pod_resources.stop(0)
            self._pod_resources = None

    async def restart(self, *, wipe_plugin_sockets: bool = True) -> None:
        """Stop, forget the plugins, empty the plugin directory of its sockets (as the
        kubelet does when it starts), and serve a new ``kubelet.sock``."""
        await self._stop_registration()
        if wipe_plugin_sockets:
            for path in self.plugin_dir.iterdir():
                if path.is_socket():
                    path.unlink()
        self.socket.unlink(missing_ok=True)
        await self._serve_registration()

    async def _serve_registration(self) -> None:
        server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._registration = server

    async def _stop_registration(self) -> None:
        if self._registration is not None:
            await self._registration.stop(0)
            self._registration = None
        for plugin in list(self.plugins.values()):
            await self._disconnect(plugin)
        self.plugins.clear()
        await self._notify()

    # -- Registration ------------------------------------------------------------------

    async def Register(self, request: dp.RegisterRequest, context: Context) -> dp.Empty:
        self.register_requests.append(request)
        if self.refuse_registrations > 0:
            self.refuse_registrations -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the kubelet is not ready")
        if request.version not in SUPPORTED_VERSIONS:
            await context.abort(
                grpc.StatusCode.UNKNOWN,
                f"Requested device plugin version {request.version} is not supported",
            )
        domain, slash, _ = request.resource_name.partition("/")
        if not slash or domain in ("kubernetes.io", "requests"):
            await context.abort(
                grpc.StatusCode.UNKNOWN,
                f"invalid name of device plugin socket: {request.resource_name}",
            )
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}")
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = await stub.GetDevicePluginOptions(dp.Empty(), timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            await channel.close()
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"failed to get device plugin options: {exc.details()}"
            )
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._disconnect(old)
        plugin = Plugin(request=request, options=options, channel=channel, stub=stub)
        plugin.task = asyncio.create_task(
            self._list_and_watch(plugin), name=f"fake-kubelet-watch-{request.resource_name}"
        )
        self.plugins[request.resource_name] = plugin
        await self._notify()
        return dp.Empty()

    async def _list_and_watch(self, plugin: Plugin) -> None:
        try:
            async for answer in plugin.stub.ListAndWatch(dp.Empty()):
                plugin.devices = {d.ID: d.health for d in answer.devices}
                plugin.updates += 1
                await self._notify()
        except grpc.aio.AioRpcError:
            pass  # the plugin went away: as when its stream ends
        plugin.devices = dict.fromkeys(plugin.devices, UNHEALTHY)
        await self._notify()

    async def _disconnect(self, plugin: Plugin) -> None:
        if plugin.task is not None:
            plugin.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await plugin.task
        await plugin.channel.close()

    # -- what tests look at --------------------------------------------------------------

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate()`` holds; it is checked at each change seen here."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    def devices(self, resource_name: str = RESOURCE) -> dict[str, str]:
        plugin = self.plugins.get(resource_name)
        return dict(plugin.devices) if plugin else {}

    def healthy(self, resource_name: str = RESOURCE) -> list[str]:
        return [d for d, h in self.devices(resource_name).items() if h == HEALTHY]

    # -- allocation ----------------------------------------------------------------------

    async def allocate(
        self,
        pod_namespace: str,
        pod_name: str,
        container: str,
        count: int,
        resource_name: str = RESOURCE,
        *,
        pre_start: bool = True,
    ) -> Outcome:
        """Admit one container as the kubelet does: pick, Allocate, then (``pre_start``)
        PreStartContainer; the outcome says where it failed, if it did."""
        async with self._admitting:
            plugin = self.plugins.get(resource_name)
            try:
                free = self._free(plugin, resource_name, count)
            except AdmissionRejected as rejected:
                return Outcome(device_ids=[], error=rejected, failed_at="Allocate")
            assert plugin is not None
            ids = await self._pick(plugin, free, count)
            outcome = await self._allocate(plugin, pod_namespace, pod_name, container, ids)
        if outcome.error is None and pre_start:
            await self._pre_start(plugin, outcome)
        return outcome

    async def allocate_ids(
        self,
        pod_namespace: str,
        pod_name: str,
        container: str,
        ids: Sequence[str],
        resource_name: str = RESOURCE,
    ) -> Outcome:
        """Allocate exactly ``ids``, advertised or not (as a kubelet whose device list is
        stale, or any other client of the plugin socket, may ask); then PreStartContainer."""
        plugin = self.plugins.get(resource_name)
        if plugin is None:
            raise FakeKubeletError(f"no device plugin registered for {resource_name}")
        async with self._admitting:
            outcome = await self._allocate(plugin, pod_namespace, pod_name, container, list(ids))
        if outcome.error is None:
            await self._pre_start(plugin, outcome)
        return outcome

    async def pre_start(
        self, pod_namespace: str, pod_name: str, container: str, resource_name: str = RESOURCE
    ) -> Outcome:
        """PreStartContainer for a container allocated before (a container started, or
        started again), through the plugin registered now."""
        plugin = self.plugins.get(resource_name)
        if plugin is None:
            raise FakeKubeletError(f"no device plugin registered for {resource_name}")
        [ids] = [
            a.device_ids
            for a in self.assignments
            if (a.namespace, a.pod, a.container, a.resource_name)
            == (pod_namespace, pod_name, container, resource_name)
        ]
        outcome = Outcome(device_ids=list(ids))
        await self._pre_start(plugin, outcome)
        return outcome

    def _free(self, plugin: Plugin | None, resource_name: str, count: int) -> list[str]:
        """The free healthy ids, or the device manager's own rejection (its order of
        checks and its words: devicesToAllocate in the kubelet's devicemanager)."""
        if plugin is None:
            raise AdmissionRejected(f"cannot allocate unregistered device {resource_name}")
        healthy = self.healthy(resource_name)
        if not healthy:
            raise AdmissionRejected(
                f"no healthy devices present; cannot allocate unhealthy devices {resource_name}"
            )
        taken = {
            d for a in self.assignments if a.resource_name == resource_name for d in a.device_ids
        }
        free = [d for d in healthy if d not in taken]
        if len(free) < count:
            raise AdmissionRejected(
                f"requested number of devices unavailable for {resource_name}. "
                f"Requested: {count}, Available: {len(free)}"
            )
        return free

    async def _allocate(
        self, plugin: Plugin, pod_namespace: str, pod_name: str, container: str, ids: list[str]
    ) -> Outcome:
        """Allocate ``ids`` and record the pod's ids when the plugin answers."""
        outcome = Outcome(device_ids=list(ids))
        try:
            answer = await plugin.stub.Allocate(
                dp.AllocateRequest(
                    container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
                ),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            outcome.error, outcome.failed_at = exc, "Allocate"
            return outcome
        if len(answer.container_responses) != 1:
            raise FakeKubeletError(f"Allocate answered {len(answer.container_responses)} times")
        outcome.response = answer.container_responses[0]
        self.record(pod_namespace, pod_name, container, plugin.request.resource_name, ids)
        return outcome

    async def _pre_start(self, plugin: Plugin, outcome: Outcome) -> None:
        if not plugin.options.pre_start_required:
            return
        try:
            await plugin.stub.PreStartContainer(
                dp.PreStartContainerRequest(devices_ids=outcome.device_ids),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            outcome.error, outcome.failed_at = exc, "PreStartContainer"

    async def _pick(self, plugin: Plugin, free: Sequence[str], count: int) -> list[str]:
        """The plugin's preference among the free ids, when it offers one, topped up from
        the rest (the kubelet ignores preferred ids that are not available)."""
        if not plugin.options.get_preferred_allocation_available:
            return list(free[:count])
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=free, must_include_deviceIDs=[], allocation_size=count
                )
            ]
        )
        self.preferred_requests.append(request)
        answer = await plugin.stub.GetPreferredAllocation(request, timeout=self.rpc_timeout_s)
        chosen = [d for d in answer.container_responses[0].deviceIDs if d in free][:count]
        return chosen + [d for d in free if d not in chosen][: count - len(chosen)]

    def record(
        self, namespace: str, pod: str, container: str, resource_name: str, ids: Sequence[str]
    ) -> None:
        """Record an assignment (``allocate`` does; a test may for another resource)."""
        self.assignments.append(Assignment(namespace, pod, container, resource_name, tuple(ids)))

    def release(self, pod_namespace: str, pod_name: str) -> None:
        """The pod is gone: its devices are free again."""
        self.assignments = [
            a for a in self.assignments if (a.namespace, a.pod) != (pod_namespace, pod_name)
        ]

    # -- PodResourcesLister --------------------------------------------------------------

    def _pod(self, namespace: str, name: str) -> pr.PodResources:
        containers: dict[str, pr.ContainerResources] = {}
        for a in self.assignments:
            if (a.namespace, a.pod) == (namespace, name):
                c = containers.setdefault(a.container, pr.ContainerResources(name=a.container))
                c.devices.add(resource_name=a.resource_name, device_ids=a.device_ids)
        return pr.PodResources(name=name, namespace=namespace, containers=containers.values())

    async def List(
        self, request: pr.ListPodResourcesRequest, context: Context
    ) -> pr.ListPodResourcesResponse:
        pods = dict.fromkeys((a.namespace, a.pod) for a in self.assignments)
        return pr.ListPodResourcesResponse(pod_resources=[self._pod(ns, n) for ns, n in pods])

    async def Get(
        self, request: pr.GetPodResourcesRequest, context: Context
    ) -> pr.GetPodResourcesResponse:
        key = (request.pod_namespace, request.pod_name)
        if key not in {(a.namespace, a.pod) for a in self.assignments}:
            await context.abort(
                grpc.StatusCode.UNKNOWN,
                f"pod {request.pod_name} not found in {request.pod_namespace}",
            )
        return pr.GetPodResourcesResponse(pod_resources=self._pod(*key))

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: Context
    ) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse(
            devices=[
                pr.ContainerDevices(resource_name=name, device_ids=self.healthy(name))
                for name in self.plugins
            ]
        )
