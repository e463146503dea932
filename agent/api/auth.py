"""Authentication of the scheduler's TCP listener: mutual TLS, or a bearer token over
server TLS (plaintext only on loopback behind ``api.insecure_loopback``).

The token is read from a file (see :mod:`agent.api.tokens`), compared in constant time,
and never logged. A call without it, or with a wrong one, is UNAUTHENTICATED before any
handler runs. Certificates are served through gRPC's dynamic credentials, so a reload
(SIGHUP) makes every new handshake use the new files while open connections go on.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from agent.api.tokens import TokenHolder, read_token
from agent.core.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["ReloadableTls", "TlsFiles", "TokenHolder", "TokenInterceptor", "read_token"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Server certificate and key; with ``client_ca_file`` clients must present a
    certificate that chains to it (mutual TLS)."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""

    @property
    def mutual(self) -> bool:
        return bool(self.client_ca_file)

    def configuration(self) -> Any:
        """A gRPC certificate configuration of the files as they are now; a ConfigError if
        one is unreadable or the key does not match the certificate."""
        try:
            key = Path(self.key_file).read_bytes()
            cert = Path(self.cert_file).read_bytes()
            ca = Path(self.client_ca_file).read_bytes() if self.client_ca_file else None
        except OSError as exc:
            raise ConfigError("api.tls_cert_file", f"cannot read TLS material: {exc}") from exc
        _check_pair(self.cert_file, self.key_file)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def _check_pair(cert_file: str, key_file: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            "api.tls_key_file", f"{key_file} and {cert_file} are not a usable pair: {exc}"
        ) from exc


class ReloadableTls:
    """Server credentials whose certificate configuration :meth:`reload` replaces."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._initial = files.configuration()
        self._pending: Any = None
        self._lock = threading.Lock()

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self._fetch, require_client_authentication=self.files.mutual
        )

    def reload(self) -> None:
        """Read the files again; a bad file raises ConfigError and keeps the old ones."""
        fresh = self.files.configuration()
        with self._lock:
            self._pending = fresh

    def _fetch(self) -> Any:
        """Called by gRPC before a handshake: the new configuration once, else None."""
        with self._lock:
            fresh, self._pending = self._pending, None
        return fresh


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Lets a call through only with ``authorization: Bearer <token>``; health checks too
    need it, so an unauthenticated prober learns nothing. The token is read from a
    :class:`TokenHolder` at every call, so a reload applies to the next call."""

    def __init__(self, token: TokenHolder) -> None:
        self._token = token

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        metadata = dict(handler_call_details.invocation_metadata or ())
        sent = str(metadata.get("authorization", "")).encode()
        if self._token.match(sent) is not None:
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        return _denied_like(handler, "missing or wrong bearer token")


def _denied_like(
    handler: grpc.RpcMethodHandler[Any, Any], message: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same streaming shape that refuses the call."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    deserializer = getattr(handler, "request_deserializer", None)
    serializer = getattr(handler, "response_serializer", None)
    if getattr(handler, "response_streaming", False):
        return grpc.unary_stream_rpc_method_handler(
            refuse,
            request_deserializer=deserializer,
            response_serializer=serializer,
        )
    return grpc.unary_unary_rpc_method_handler(
        refuse,
        request_deserializer=deserializer,
        response_serializer=serializer,
    )


def reload_all(parts: list[TokenHolder | ReloadableTls]) -> list[str]:
    """Reload every token and certificate set; the problems of those that failed (they keep
    their old material)."""
    problems = []
    for part in parts:
        try:
            part.reload()
        except ConfigError as exc:
            problems.append(str(exc))
    return problems
