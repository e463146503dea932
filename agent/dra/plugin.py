"""The agent as a DRA kubelet plugin: it serves the driver's services on
``<plugin_dir>/dra.sock``, then the ``pluginregistration.v1`` Registration service on
``<registry_dir>/<driver>-reg.sock``, where the kubelet's plugin watcher finds it.

The kubelet dials the registration socket, asks ``GetInfo`` and answers with
``NotifyRegistrationStatus``; a refusal is logged (its reason escaped and cut, as all a
caller sends) and kept (``registration_error``), and the kubelet tries again on its own.
As on the driver's socket, a request that cannot be decoded is INVALID_ARGUMENT. A
removed socket (the kubelet deregisters a plugin whose registration socket goes) is
noticed by polling: both are served again, the driver's first, so the kubelet never
registers an endpoint that is not there yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from agent.core.logsafe import escaped
from agent.dra.proto import registration_pb2 as reg_pb
from agent.dra.proto import registration_pb2_grpc as reg_grpc
from agent.dra.service import DraService, add_servicer, add_services
from agent.kubelet.sockets import FileId, file_id, remove_stale_socket

log = logging.getLogger(__name__)

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/plugins/gpushare.io"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGIN_TYPE = "DRAPlugin"
# The kubelet takes the first DRAPlugin service it supports: v1 first; then the health
# services, served on the same socket.
SUPPORTED_VERSIONS = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)
UNIX_PATH_BYTES = 107  # sun_path is 108 bytes with its terminating NUL


class DraPluginError(Exception):
    """The plugin cannot serve: a socket path is too long or cannot be bound."""


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver_name: str, endpoint: Path) -> None:
        self._driver_name = driver_name
        self._endpoint = endpoint
        self.registered = False
        self.error = ""
        self.notifications = 0

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver_name,
            endpoint=str(self._endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.notifications += 1
        self.registered, self.error = request.plugin_registered, request.error
        if request.plugin_registered:
            log.info("DRA driver %s: registered with the kubelet", self._driver_name)
        else:
            log.warning(
                "DRA driver %s: the kubelet refused the registration: %s",
                self._driver_name,
                escaped(request.error) or "(no reason given)",
            )
        return reg_pb.RegistrationStatusResponse()


def _check_path(path: Path) -> None:
    if len(os.fsencode(path)) > UNIX_PATH_BYTES:
        raise DraPluginError(f"socket path {path} is longer than {UNIX_PATH_BYTES} bytes")


def _remove_stale(path: Path) -> None:
    if not remove_stale_socket(path):
        raise DraPluginError(f"cannot serve on {path}: a directory is there")


class _Socket:
    """One gRPC server on one Unix socket, served again when its file goes away."""

    def __init__(self, path: Path, add: Any) -> None:
        self.path = path
        self._add = add
        self._server: grpc.aio.Server | None = None
        self._id: FileId | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None and file_id(self.path) == self._id

    async def serve(self) -> None:
        _check_path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(self.path)
        server = grpc.aio.server()
        self._add(server)
        try:
            server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError as exc:
            raise DraPluginError(f"cannot serve on {self.path}: {exc}") from exc
        await server.start()
        self._server, self._id = server, file_id(self.path)

    async def stop(self, grace_s: float) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
        if self._id is not None and file_id(self.path) == self._id:
            self.path.unlink(missing_ok=True)
        self._id = None


class DraPluginServer:
    """``start`` serves the driver's socket, then the registration socket; ``stop`` ends
    the health streams and removes both (the kubelet then deregisters the driver)."""

    def __init__(
        self,
        service: DraService,
        *,
        driver_name: str,
        plugin_dir: str | os.PathLike[str] = DEFAULT_PLUGIN_DIR,
        registry_dir: str | os.PathLike[str] = DEFAULT_REGISTRY_DIR,
        poll_s: float = 1.0,
    ) -> None:
        self.service = service
        self.driver_name = driver_name
        endpoint = Path(plugin_dir) / "dra.sock"
        self.registration = Registration(driver_name, endpoint)
        self._dra = _Socket(endpoint, lambda server: add_services(server, service))
        self._reg = _Socket(
            Path(registry_dir) / f"{driver_name}-reg.sock",
            lambda server: add_servicer(server, reg_pb, "Registration", self.registration),
        )
        self._poll_s = poll_s
        self._supervisor: asyncio.Task[None] | None = None
        self.restarts = 0  # times the sockets were served again after going away

    @property
    def socket_path(self) -> Path:
        return self._dra.path

    @property
    def registration_socket(self) -> Path:
        return self._reg.path

    async def start(self) -> None:
        if self._supervisor is not None:
            raise RuntimeError("the DRA plugin is already started")
        await self._serve_both()
        self._supervisor = asyncio.create_task(self._supervise(), name="dra-kubelet-plugin")
        log.info(
            "DRA driver %s serving on %s, registration on %s",
            self.driver_name,
            self._dra.path,
            self._reg.path,
        )

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
            self._supervisor = None
        self.service.close()
        await self._reg.stop(grace_s)  # deregistered first: no call to a closing socket
        await self._dra.stop(grace_s)
        self.registration.registered = False

    async def _serve_both(self) -> None:
        await self._reg.stop(0)
        await self._dra.stop(0)
        await self._dra.serve()
        await self._reg.serve()
        self.registration.registered = False

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            if self._dra.serving and self._reg.serving:
                continue
            log.warning("DRA driver %s: a plugin socket went away; serving again", self.driver_name)
            try:
                await self._serve_both()
                self.restarts += 1
            except Exception:
                log.exception("DRA driver %s: serving the sockets again failed", self.driver_name)
