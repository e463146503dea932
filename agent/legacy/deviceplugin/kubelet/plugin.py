"""The agent as a kubelet device plugin: it serves ``v1beta1.DevicePlugin`` on
``<plugin_dir>/gpushare.sock`` and registers it with the kubelet on
``<plugin_dir>/kubelet.sock``.

The kubelet forgets its plugins when it restarts: it empties the plugin directory (our
socket included), creates a new ``kubelet.sock`` and waits for plugins to register again.
A supervisor task notices that by polling both sockets: it serves again on a socket that
was removed, and registers again with each new kubelet socket. A failed registration is
logged and retried with backoff; it never stops the plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import grpc
import grpc.aio

from agent.kubelet.sockets import FileId, file_id, remove_stale_socket
from agent.legacy.deviceplugin.kubelet.port import DEFAULT_RESOURCE_NAME, Allocator
from agent.legacy.deviceplugin.kubelet.proto import deviceplugin_pb2 as pb
from agent.legacy.deviceplugin.kubelet.proto import deviceplugin_pb2_grpc as pb_grpc
from agent.legacy.deviceplugin.kubelet.service import DevicePluginService, plugin_options

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
ENDPOINT = "gpushare.sock"
KUBELET_SOCKET = "kubelet.sock"


class DevicePluginError(Exception):
    """The plugin cannot serve: its socket cannot be bound."""


class DevicePluginServer:
    """``start`` serves the plugin socket and registers; ``stop`` ends the ListAndWatch
    streams (the kubelet then marks the devices unhealthy) and removes the socket."""

    def __init__(
        self,
        allocator: Allocator,
        *,
        resource_name: str = DEFAULT_RESOURCE_NAME,
        plugin_dir: str | os.PathLike[str] = DEFAULT_PLUGIN_DIR,
        poll_s: float = 1.0,
        register_timeout_s: float = 5.0,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
    ) -> None:
        self._allocator = allocator
        self.resource_name = resource_name
        self.plugin_dir = Path(plugin_dir)
        self._poll_s = poll_s
        self._register_timeout_s = register_timeout_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._server: grpc.aio.Server | None = None
        self._service: DevicePluginService | None = None
        self._socket_id: FileId | None = None
        self._kubelet_id: FileId | None = None  # the kubelet socket registered with
        self._supervisor: asyncio.Task[None] | None = None
        self.registrations = 0  # successful Register calls since the plugin was made

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / ENDPOINT

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    @property
    def registered(self) -> bool:
        """Registered with the kubelet socket that is there now."""
        return self._kubelet_id is not None and self._kubelet_id == file_id(self.kubelet_socket)

    async def start(self) -> None:
        """Serve on the plugin socket (a stale one is replaced), then register; when the
        kubelet cannot be reached, registration goes on in the background."""
        if self._supervisor is not None:
            raise RuntimeError("the device plugin is already started")
        await self._serve()
        registered = await self._register()
        self._supervisor = asyncio.create_task(
            self._supervise(registered), name="kubelet-device-plugin"
        )

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
            self._supervisor = None
        await self._stop_serving(grace_s)
        self._kubelet_id = None

    def devices_changed(self) -> None:
        """Send the allocator's current ids on every open ListAndWatch stream."""
        if self._service is not None:
            self._service.devices_changed()

    async def _serve(self) -> None:
        path = self.socket_path
        self._remove_stale(path)
        server = grpc.aio.server()
        service = DevicePluginService(self._allocator, self.resource_name)
        pb_grpc.add_DevicePluginServicer_to_server(service, server)
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            raise DevicePluginError(f"cannot serve the device plugin on {path}: {exc}") from exc
        await server.start()
        self._server, self._service, self._socket_id = server, service, file_id(path)
        log.info("device plugin for %s serving on %s", self.resource_name, path)

    @staticmethod
    def _remove_stale(path: Path) -> None:
        if not remove_stale_socket(path):
            raise DevicePluginError(f"cannot serve the device plugin on {path}: a directory")

    async def _stop_serving(self, grace_s: float) -> None:
        server, service = self._server, self._service
        self._server = self._service = None
        if service is not None:
            service.close()  # ListAndWatch streams end now, not after the grace
        if server is not None:
            await server.stop(grace_s)
        if self._socket_id is not None and file_id(self.socket_path) == self._socket_id:
            self.socket_path.unlink(missing_ok=True)
        self._socket_id = None

    async def _register(self) -> bool:
        """Register with the kubelet socket there now; False (logged) when that fails."""
        kubelet_id = file_id(self.kubelet_socket)
        if kubelet_id is None:
            log.info("%s: no kubelet at %s yet", self.resource_name, self.kubelet_socket)
            return False
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=ENDPOINT,
            resource_name=self.resource_name,
            options=plugin_options(),
        )
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                stub = pb_grpc.RegistrationStub(channel)
                await stub.Register(request, timeout=self._register_timeout_s)
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "%s: registering with the kubelet at %s failed: %s: %s",
                self.resource_name,
                self.kubelet_socket,
                exc.code().name,
                exc.details(),
            )
            return False
        except Exception:
            log.exception("%s: registering with the kubelet failed", self.resource_name)
            return False
        self._kubelet_id = kubelet_id
        self.registrations += 1
        log.info("%s: registered with the kubelet at %s", self.resource_name, self.kubelet_socket)
        return True

    async def _supervise(self, registered: bool) -> None:
        """Keep serving and registered: poll both sockets, back off after failures."""
        failures = 0 if registered else 1
        while True:
            await asyncio.sleep(self._delay(failures))
            try:
                ok = await self._check()
            except Exception:
                log.exception("%s: device-plugin supervision failed", self.resource_name)
                ok = False
            failures = 0 if ok else failures + 1

    async def _check(self) -> bool:
        """One look at both sockets; False when something was to be done and failed."""
        if self._server is None or file_id(self.socket_path) is None:
            log.warning(
                "%s: the device-plugin socket %s was removed; serving again",
                self.resource_name,
                self.socket_path,
            )
            await self._stop_serving(0)
            await self._serve()
            self._kubelet_id = None  # the kubelet must learn of the new socket
        current = file_id(self.kubelet_socket)
        if current is None:
            if self._kubelet_id is not None:
                log.warning("%s: the kubelet socket went away", self.resource_name)
            self._kubelet_id = None
            return True  # nothing to do until a kubelet is there: poll, no backoff
        if current == self._kubelet_id:
            return True
        if self._kubelet_id is not None:
            log.info("%s: the kubelet restarted; registering again", self.resource_name)
        return await self._register()

    def _delay(self, failures: int) -> float:
        if failures == 0:
            return self._poll_s
        return min(self._backoff_max_s, self._backoff_s * 2.0 ** (failures - 1))
