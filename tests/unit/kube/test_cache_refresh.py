"""The agents' cache asks an agent's ledger again after a burst of events that may move
capacity, ledger only, and not after an allocation (the lease reached its container); a
refused token ends the connection, and the next one reads the token again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.client import TokenFile
from agent.kube import cache as cache_module
from agent.kube.cache import AgentCache, NodeEntry
from agent.kube.service import ClusterOptions, connector
from agent.kube.views import lease_of


class Link:
    def __init__(self) -> None:
        self.asked: list[bool] = []  # ledger_only of each GetNode
        self.events: asyncio.Queue[pb.Event] = asyncio.Queue()

    async def get_node(self, *, ledger_only: bool = False) -> pb.GetNodeResponse:
        self.asked.append(ledger_only)
        return pb.GetNodeResponse()

    async def watch_events(self, *, since_seq: int = 0) -> AsyncIterator[pb.Event]:
        while True:
            yield await self.events.get()


async def settle(link: Link, event: pb.Event) -> int:
    """GetNodes that ``event`` brought about."""
    before = len(link.asked)
    link.events.put_nowait(event)
    await asyncio.sleep(0.1)  # several coalescing intervals
    return len(link.asked) - before


async def test_capacity_events_refresh_and_allocations_do_not() -> None:
    link = Link()
    entry = NodeEntry("n1", "127.0.0.1:1")
    following = asyncio.create_task(
        AgentCache(lambda target: None)._serve(entry, link)  # type: ignore[arg-type,return-value]
    )
    try:
        await asyncio.sleep(0.05)
        assert link.asked == [True]  # at connect
        assert await settle(link, pb.Event(seq=1, kind="lease.admitted", lease_id="l-a")) == 1
        assert await settle(link, pb.Event(seq=2, kind="lease.allocated", lease_id="l-a")) == 0
        assert "l-a" in entry.allocated_ids
        assert await settle(link, pb.Event(seq=3, kind="lease.released", lease_id="l-a")) == 1
        assert await settle(link, pb.Event(seq=4, kind="device.drained")) == 1
        assert all(link.asked)
        assert cache_module.COALESCE_S < 0.05
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_refused_token_ends_the_connection_to_connect_again() -> None:
    """A rotated token: the open stream was accepted with the old one, but the next GetNode
    is refused; the connection ends so the next one reads the token again."""

    class Refusing(Link):
        async def get_node(self, *, ledger_only: bool = False) -> pb.GetNodeResponse:
            if self.asked:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    "invalid bearer token",
                )
            return await super().get_node(ledger_only=ledger_only)

    link = Refusing()
    entry = NodeEntry("n1", "127.0.0.1:1")
    serving = AgentCache(lambda target: None)._serve(entry, link)  # type: ignore[arg-type,return-value]
    link.events.put_nowait(pb.Event(seq=1, kind="lease.admitted", lease_id="l-a"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(serving, 2)
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert entry.stale


def test_each_call_reads_the_agents_token_again_once_it_changed(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    connect = connector(ClusterOptions(agent_token_file=str(token), insecure_agents=True))
    client = connect("127.0.0.1:1")
    assert client._metadata() == (("authorization", "Bearer first"),)  # type: ignore[attr-defined]
    aside = tmp_path / "token.new"
    aside.write_text("second\n")
    aside.replace(token)  # a new file in its place, as a Secret's update is
    assert client._metadata() == (("authorization", "Bearer second"),)  # type: ignore[attr-defined]
    assert connect("127.0.0.1:2")._metadata() == (("authorization", "Bearer second"),)  # type: ignore[attr-defined]
    token.unlink()  # mid-rotation: the last one read is kept
    assert client._metadata() == (("authorization", "Bearer second"),)  # type: ignore[attr-defined]


def test_a_token_file_caught_empty_keeps_the_last_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    source = TokenFile(str(token))
    token.write_text("")  # a rewrite in place, caught half way
    assert source() == "first"
    token.write_bytes(b"\xff\xfe")  # not text: the last token, a warning
    assert source() == "first"
    token.write_text("second\n")
    assert source() == "second"
    token.write_text("")
    with pytest.raises(ValueError, match="empty"):
        TokenFile(str(token))


async def test_a_pending_lease_that_ended_before_an_answer_showed_it_is_not_counted() -> None:
    """A lease granted to a bind counts until an answer shows it; if it ends first (the
    pod gone at once, an eviction), no answer ever will: its end event drops it."""
    link = Link()
    cache = AgentCache(lambda target: None)  # type: ignore[arg-type,return-value]
    entry = cache.nodes["n1"] = NodeEntry("n1", "127.0.0.1:1")
    following = asyncio.create_task(cache._serve(entry, link))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.05)
        granted = pb.Lease(
            lease_id="l-a",
            request_id="u-1",
            device_uuid="x",
            state="admitted",
            priority="burstable",
        )
        cache.add_pending("n1", lease_of(granted))
        version = entry.pending_version
        await settle(link, pb.Event(seq=1, kind="lease.allocated", lease_id="l-a"))
        assert "l-a" in entry.pending  # allocated: still live
        await settle(link, pb.Event(seq=2, kind="lease.released", lease_id="l-a"))
        assert "l-a" not in entry.pending and entry.pending_version > version
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
