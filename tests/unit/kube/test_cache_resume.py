"""The agents' cache resumes a broken event stream after the last event it saw, not after
the newest one of the next GetNode: what came while it was reconnecting (an eviction the
lease controller acts on, an allocation a bind waits for) still reaches the listeners."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.legacy.cluster.cache import AgentCache, NodeEntry


class Link:
    """An agent whose event stream breaks after its first events."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def get_node(self, *, ledger_only: bool = False) -> pb.GetNodeResponse:
        self.agent.answers += 1  # the first answer comes before any event
        return pb.GetNodeResponse(
            last_event_seq=self.agent.last_seq if self.agent.answers > 1 else 0
        )

    async def watch_events(self, *, since_seq: int = 0) -> AsyncIterator[pb.Event]:
        self.agent.asked.append(since_seq)
        for event in self.agent.events:
            if event.seq > since_seq:
                yield event
        if len(self.agent.asked) == 1:
            self.agent.events.append(pb.Event(seq=3, kind="lease.evicted", lease_id="l-b"))
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone"
            )
        await asyncio.Event().wait()  # the second stream stays open


class Agent:
    def __init__(self) -> None:
        self.events = [pb.Event(seq=1, kind="lease.admitted"), pb.Event(seq=2, kind="x")]
        self.asked: list[int] = []
        self.answers = 0

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq


async def test_a_broken_stream_resumes_after_the_last_event_seen() -> None:
    agent = Agent()
    cache = AgentCache(lambda target: None)  # type: ignore[arg-type,return-value]
    seen: list[tuple[int, str]] = []
    cache.listeners.append(lambda node, event: seen.append((event.seq, event.kind)))
    entry = NodeEntry("n1", "127.0.0.1:1")
    with pytest.raises(grpc.aio.AioRpcError):  # the first stream breaks after seq 2
        await cache._serve(entry, Link(agent))  # type: ignore[arg-type]
    again = asyncio.create_task(cache._serve(entry, Link(agent)))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(5):
            while (3, "lease.evicted") not in seen:
                await asyncio.sleep(0.01)
    finally:
        again.cancel()
        await asyncio.gather(again, return_exceptions=True)
    assert agent.asked == [0, 2], (
        "the second stream must start after seq 2, not the next GetNode's 3"
    )
    assert seen == [(1, "lease.admitted"), (2, "x"), (3, "lease.evicted")]
