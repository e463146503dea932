"""Calls to the local agent over its Unix socket, with errors people can act on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc


class AgentUnreachable(Exception):
    """The agent's socket is missing or nobody answers on it."""


class AgentRefused(Exception):
    """The agent answered with an error status (bad input, not found, ...)."""


def _channel(socket_path: str) -> grpc.Channel:
    if not os.path.exists(socket_path):
        raise AgentUnreachable(
            f"no agent socket at {socket_path}: is the agent running (gpushare serve)? "
            "Use --socket or GPUSHARE_SOCKET if it listens elsewhere"
        )
    return grpc.insecure_channel(f"unix:{socket_path}")


def call(socket_path: str, method: str, request: Any, *, timeout_s: float = 5.0) -> Any:
    """One unary call of ``gpushare.v1.Agent``; errors become AgentUnreachable/Refused."""
    with _channel(socket_path) as channel:
        stub = pb_grpc.AgentStub(channel)
        try:
            return getattr(stub, method)(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise AgentUnreachable(
                    f"the agent at {socket_path} did not answer: {code.name}: {exc.details()}"
                ) from exc
            raise AgentRefused(f"{code.name}: {exc.details()}") from exc


def get_node(socket_path: str, *, timeout_s: float = 5.0) -> pb.GetNodeResponse:
    response: pb.GetNodeResponse = call(
        socket_path, "GetNode", pb.GetNodeRequest(), timeout_s=timeout_s
    )
    return response


def watch_events(socket_path: str, since_seq: int) -> Iterator[pb.Event]:
    with _channel(socket_path) as channel:
        stub = pb_grpc.AgentStub(channel)
        try:
            yield from stub.WatchEvents(pb.WatchEventsRequest(since_seq=since_seq))
        except grpc.RpcError as exc:
            raise AgentUnreachable(f"event stream ended: {exc.code().name}") from exc
