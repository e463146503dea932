"""Registers the Agent service with request parsing that cannot crash a call.

grpc's generated registration parses each request with ``FromString``; bytes that are not
a valid message raise inside grpc and the caller gets ``UNKNOWN`` with a Python exception
name. Here a request that does not parse answers ``INVALID_ARGUMENT`` naming the message
type, like every other malformed input.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from agent.api.proto import agent_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["Agent"]
_MALFORMED = object()


def _parser(message: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except DecodeError:
            return _MALFORMED

    return parse


def _unary(method: Any, type_name: str) -> Callable[..., Any]:
    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if request is _MALFORMED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a valid {type_name}")
        return await method(request, context)

    return handle


def _streaming(method: Any, type_name: str) -> Callable[..., AsyncIterator[Any]]:
    async def handle(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        if request is _MALFORMED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a valid {type_name}")
        async for answer in method(request, context):
            yield answer

    return handle


def _passing_bytes(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A stream may yield messages already serialized (one event, many watchers)."""

    def run(message: Any) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)

    return run


def add_agent_service(servicer: Any, server: grpc.aio.Server) -> None:
    handlers = {}
    for method in SERVICE.methods:
        request = getattr(pb, method.input_type.name)
        response = getattr(pb, method.output_type.name)
        implementation = getattr(servicer, method.name)
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _streaming(implementation, method.input_type.name),
                request_deserializer=_parser(request),
                response_serializer=_passing_bytes(response.SerializeToString),
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary(implementation, method.input_type.name),
                request_deserializer=_parser(request),
                response_serializer=response.SerializeToString,
            )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
    )
