"""Authentication of the scheduler's TCP listener: a bearer token or mutual TLS.

The token is read from a file at start, compared in constant time, and never logged. A
call without it, or with a wrong one, is UNAUTHENTICATED before any handler runs.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from agent.core.errors import ConfigError


def read_token(path: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError("api.token_file", f"cannot read {path}: {exc.strerror}") from exc
    if len(token) < 16:
        raise ConfigError("api.token_file", "the token must be at least 16 characters")
    return token


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert_file: str
    key_file: str
    client_ca_file: str

    def credentials(self) -> grpc.ServerCredentials:
        try:
            key = Path(self.key_file).read_bytes()
            cert = Path(self.cert_file).read_bytes()
            ca = Path(self.client_ca_file).read_bytes()
        except OSError as exc:
            raise ConfigError("api.tls_cert_file", f"cannot read TLS material: {exc}") from exc
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=True
        )


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Lets a call through only with ``authorization: Bearer <token>``; health checks too
    need it, so an unauthenticated prober learns nothing."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        metadata = dict(handler_call_details.invocation_metadata or ())
        sent = str(metadata.get("authorization", "")).encode()
        if hmac.compare_digest(sent, self._expected):
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
