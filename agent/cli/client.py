"""Calls to the local agent over its Unix socket, with errors people can act on."""

from __future__ import annotations

import os

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc


class AgentUnreachable(Exception):
    """The agent's socket is missing or nobody answers on it."""


def get_node(socket_path: str, *, timeout_s: float = 5.0) -> pb.GetNodeResponse:
    if not os.path.exists(socket_path):
        raise AgentUnreachable(
            f"no agent socket at {socket_path}: is the agent running (gpushare serve)? "
            "Use --socket or GPUSHARE_SOCKET if it listens elsewhere"
        )
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub = pb_grpc.AgentStub(channel)
        try:
            response: pb.GetNodeResponse = stub.GetNode(pb.GetNodeRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise AgentUnreachable(
                f"the agent at {socket_path} did not answer: {exc.code().name}: {exc.details()}"
            ) from exc
    return response
