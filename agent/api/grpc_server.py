"""The gRPC server: the ``gpushare.v1.Agent`` service, health and reflection.

Listeners: a Unix socket for the local CLI (mode 0660) and, optionally, TCP for the
central scheduler. Errors from the agent's tree are mapped to status codes here and only
here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection

from agent.api.convert import snapshot_to_pb
from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.errors import GpushareError
from agent.core.types import NodeSnapshot

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Agent"].full_name
SOCKET_MODE = 0o660


class AgentService(pb_grpc.AgentServicer):
    def __init__(self, snapshot: Callable[[], NodeSnapshot]) -> None:
        self._snapshot = snapshot

    async def GetNode(
        self, request: pb.GetNodeRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetNodeResponse:
        try:
            return snapshot_to_pb(self._snapshot())
        except GpushareError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # abort raises; this line is never reached


class GrpcServer:
    """Owns the grpc.aio server. ``start`` binds; ``stop`` drains within a grace period."""

    def __init__(self, service: AgentService, *, unix_socket: str, tcp_listen: str = "") -> None:
        self._service = service
        self._unix_socket = unix_socket
        self._tcp_listen = tcp_listen
        self._server: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()
        self.tcp_port: int | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        pb_grpc.add_AgentServicer_to_server(self._service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        self._bind(server, f"unix:{self._unix_socket}", "api.unix_socket")
        if self._tcp_listen:
            self.tcp_port = self._bind(server, self._tcp_listen, "api.tcp_listen")
        await server.start()
        os.chmod(self._unix_socket, SOCKET_MODE)
        serving = health_pb2.HealthCheckResponse.SERVING
        await self._health.set("", serving)
        await self._health.set(SERVICE_NAME, serving)
        self._server = server
        log.info(
            "gRPC serving on unix:%s%s",
            self._unix_socket,
            f" and {self._tcp_listen}" if self._tcp_listen else "",
        )

    @staticmethod
    def _bind(server: grpc.aio.Server, address: str, key: str) -> int:
        try:
            return server.add_insecure_port(address)
        except RuntimeError as exc:
            raise GpushareError(f"cannot serve gRPC on {address}: {exc} (see {key})") from exc

    async def stop(self, grace_s: float) -> None:
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)
        self._server = None
