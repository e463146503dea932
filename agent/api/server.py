"""One grpc.aio server on one listener: the agent service with health and reflection,
its transport security, and a reload of its token and certificates."""

from __future__ import annotations

import logging
import os

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection

from agent.api.auth import ReloadableTls, TokenHolder, TokenInterceptor, reload_all
from agent.api.grpc_server import MAX_MESSAGE_BYTES, SERVICE_NAME, AgentService
from agent.api.peerlog import quiet_peer_gone
from agent.api.registration import add_agent_service
from agent.core.errors import GpushareError

log = logging.getLogger(__name__)
SOCKET_MODE = 0o660


class GrpcServer:
    """One grpc.aio server on one listener. ``start`` binds; ``stop`` drains within a grace;
    ``reload`` re-reads its token and certificates (new calls and handshakes use them)."""

    def __init__(
        self,
        service: AgentService,
        *,
        address: str,
        key: str,
        token: TokenHolder | None = None,
        tls: ReloadableTls | None = None,
    ) -> None:
        self._service = service
        self._address = address
        self._key = key
        self._token = token
        self._tls = tls
        self._server: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()
        self.port: int | None = None

    async def start(self) -> None:
        quiet_peer_gone()
        interceptors = [TokenInterceptor(self._token)] if self._token else []
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        add_agent_service(self._service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        self.port = self._bind(server)
        await server.start()
        if self._address.startswith("unix:"):
            os.chmod(self._address.removeprefix("unix:"), SOCKET_MODE)  # belt and braces
        serving = health_pb2.HealthCheckResponse.SERVING
        await self._health.set("", serving)
        await self._health.set(SERVICE_NAME, serving)
        self._server = server
        log.info("gRPC serving on %s (%s)", self._bound(), self._auth_name())
        if not self._address.startswith("unix:") and self._tls is None:
            log.warning(
                "api.insecure_loopback: %s takes a bearer token over PLAINTEXT (development "
                "only; use TLS: api.tls_cert_file, api.tls_key_file)",
                self._bound(),
            )

    def _bind(self, server: grpc.aio.Server) -> int:
        """Bind the listener; a Unix socket is created with its final mode (the umask is
        narrowed around the bind, so it is never wider than SOCKET_MODE)."""
        unix = self._address.startswith("unix:")
        previous = os.umask(0o777 & ~SOCKET_MODE) if unix else None
        try:
            if self._tls is not None:
                return server.add_secure_port(self._address, self._tls.credentials())
            return server.add_insecure_port(self._address)
        except RuntimeError as exc:
            raise GpushareError(
                f"cannot serve gRPC on {self._address}: {exc} (see {self._key})"
            ) from exc
        finally:
            if previous is not None:
                os.umask(previous)

    def _bound(self) -> str:
        if self._address.startswith("unix:"):
            return self._address
        return f"{self._address.rpartition(':')[0]}:{self.port}"

    def _auth_name(self) -> str:
        if self._address.startswith("unix:"):
            return "local socket"
        tls = self._tls
        if tls is not None and tls.files.mutual:
            return "mutual TLS" + (" and token" if self._token else "")
        if tls is not None:
            return "server TLS and token"
        return "PLAINTEXT token on loopback"

    def reload(self) -> list[str]:
        """Re-read the token and certificates; the problems of what could not be reloaded
        (that part keeps its old material)."""
        parts: list[TokenHolder | ReloadableTls] = [p for p in (self._token, self._tls) if p]
        return reload_all(parts)

    async def stop(self, grace_s: float) -> None:
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)
        self._server = None
        self._service.close()
