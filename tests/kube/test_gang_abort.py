"""An abort of a gang that an agent refuses is one warning line, whatever the agent said:
its status code and its details escaped, never the multi-line text of the gRPC error. The
agent is a real gRPC server on loopback answering Abort with an error whose details hold
a newline and a terminal escape; the cluster side calls it through its real client."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.client.client import AgentClient
from agent.legacy.cluster.cache import AgentCache, NodeEntry
from agent.legacy.cluster.gangs import Gang, Gangs
from agent.legacy.cluster.line import Lines

NODE = "gpu-node-1"
DETAILS = "gang team-a/job-42 is unknown\nERROR forged line\x1b[2J"


class RefusingAgent(pb_grpc.AgentServicer):
    async def Abort(self, request: pb.GangRequest, context: Any) -> pb.GangResponse:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, DETAILS)
        raise AssertionError("unreachable")


@pytest.fixture
async def agent_target() -> AsyncIterator[str]:
    server = grpc.aio.server()
    pb_grpc.add_AgentServicer_to_server(RefusingAgent(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_a_refused_abort_is_one_escaped_line(
    agent_target: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = AgentCache(cast(Any, None))  # the node's link is set here, nothing is dialled
    gangs = Gangs(
        cache, Lines(cache, hold_s=30.0, clock=time.monotonic), ttl_s=30.0, clock=time.monotonic
    )
    lease = pb.Lease(lease_id="l-1", request_id="u-1", gang_id="team-a/job-42")
    gang = Gang("team-a/job-42", 2, time.monotonic() + 30.0, members={"u-1": (NODE, lease)})
    async with AgentClient(agent_target, attempts=1) as link:
        cache.nodes[NODE] = NodeEntry(NODE, agent_target, link=link, error="")
        with caplog.at_level(logging.WARNING, logger="agent.legacy.cluster.gangs"):
            await gangs.abort(gang)
    [record] = [r for r in caplog.records if r.name == "agent.legacy.cluster.gangs"]
    message = record.getMessage()
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert message.isprintable(), message  # no newline, no escape: one line
    assert message == (
        f"gang team-a/job-42: abort on {NODE} failed (its TTL ends it): FAILED_PRECONDITION "
        "gang team-a/job-42 is unknown\\nERROR forged line\\x1b[2J"
    )
