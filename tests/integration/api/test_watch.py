"""WatchEvents on a real gRPC server over a Unix socket, with a small ring so catch-up runs
from the store's reader: paged, dense, bounded, and refusing what it cannot serve."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.api import watch
from agent.api.grpc_server import AgentService
from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.api.server import GrpcServer
from agent.node.events import EventLog
from agent.state.port import Retention
from agent.state.sqlite import SqliteStateStore
from tests.helpers import short_dir

Feed = tuple[EventLog, SqliteStateStore, pb_grpc.AgentStub]


@pytest.fixture
async def feed(tmp_path: Path) -> AsyncIterator[Feed]:
    store = SqliteStateStore(str(tmp_path / "state.db"))
    await store.start()
    events = EventLog(capacity=20)
    await events.resume(store)
    with short_dir() as run:
        server = GrpcServer(
            AgentService(None, events, admin=True, max_batch=8),  # type: ignore[arg-type]
            address=f"unix:{run}/agent.sock",
            key="api.unix_socket",
        )
        await server.start()
        async with grpc.aio.insecure_channel(f"unix:{run}/agent.sock") as channel:
            yield events, store, pb_grpc.AgentStub(channel)
        await server.stop(0.1)
    await store.aclose()


async def publish(events: EventLog, count: int) -> None:
    for i in range(count):
        events("test.tick", f"tick {i}")
    assert await events.flush()


async def take(stream: Any, count: int) -> list[pb.Event]:
    got = []
    async for event in stream:
        got.append(event)
        if len(got) == count:
            break
    return got


async def test_catch_up_past_the_ring_is_dense_then_live(feed: Feed) -> None:
    events, _store, stub = feed
    await publish(events, 1200)  # the ring keeps the last 20 to 40; the rest is in the store
    assert events.oldest_seq > 1000
    stream = stub.WatchEvents(pb.WatchEventsRequest(since_seq=0))
    caught = await take(stream, 1200)
    assert [e.seq for e in caught] == list(range(1, 1201))
    assert {e.epoch for e in caught} == {events.epoch}
    await publish(events, 1)
    (live,) = await take(stream, 1)
    assert live.seq == 1201 and live.message == "tick 0"
    stream.cancel()


async def test_since_beyond_the_last_event_is_out_of_range(feed: Feed) -> None:
    events, _store, stub = feed
    await publish(events, 3)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await take(stub.WatchEvents(pb.WatchEventsRequest(since_seq=4)), 1)
    assert refused.value.code() is grpc.StatusCode.OUT_OF_RANGE
    assert "beyond the last event (3)" in (refused.value.details() or "")


async def test_below_the_retained_range_starts_at_the_first_retained(feed: Feed) -> None:
    events, store, stub = feed
    await publish(events, 1100)
    await store.prune(now=0, retention=Retention(max_events=1000))
    stream = stub.WatchEvents(pb.WatchEventsRequest(since_seq=0))
    (first,) = await take(stream, 1)
    assert first.seq == 101
    assert dict(await stream.initial_metadata())["gpushare-first-seq"] == "101"
    stream.cancel()


async def test_a_live_watcher_too_far_behind_is_told_where_to_resume(
    feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch, "WATCH_MAX_LAG", 5)
    events, _store, stub = feed
    stream = stub.WatchEvents(pb.WatchEventsRequest(since_seq=0))
    await stream.initial_metadata()
    await publish(events, 1)
    (seen,) = await take(stream, 1)
    await publish(events, 30)  # one batch: the watcher wakes 30 behind
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await take(stream, 30)
    assert ended.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"resume with since_seq={seen.seq}" in (ended.value.details() or "")


async def test_a_watcher_catching_up_through_the_ring_is_not_ended(
    feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind by more than the bound when it reaches the ring, but never caught up yet: it
    reads on (50 watchers were all ended this way once catch-up got faster)."""
    monkeypatch.setattr(watch, "WATCH_MAX_LAG", 5)
    monkeypatch.setattr(watch, "WATCH_PAGE", 4)
    events, _store, stub = feed
    await publish(events, 30)  # all in the ring (capacity 20, kept up to 40)
    stream = stub.WatchEvents(pb.WatchEventsRequest(since_seq=0))
    got = await take(stream, 30)
    assert [e.seq for e in got] == list(range(1, 31))
    stream.cancel()


async def test_batches_catch_up_dense_then_gather_live_events(feed: Feed) -> None:
    events, _store, stub = feed
    await publish(events, 1200)
    stream = stub.WatchEventBatches(pb.WatchEventsRequest(since_seq=0, window_ms=200))
    seqs: list[int] = []
    async for batch in stream:
        assert 0 < len(batch.events) <= watch.WATCH_PAGE
        seqs.extend(e.seq for e in batch.events)
        if seqs[-1] == 1200:
            break
    assert seqs == list(range(1, 1201))
    for _ in range(10):  # ten separate publications inside one window
        await publish(events, 1)
    live = await take(stream, 1)
    assert [e.seq for e in live[0].events] == list(range(1201, 1211))
    stream.cancel()


async def test_watchers_catching_up_together_read_each_page_once(feed: Feed) -> None:
    events, _store, stub = feed
    await publish(events, 2000)
    reads: list[int] = []
    stored_since = events.stored_since

    async def counted(seq: int, *, limit: int) -> list[Any]:
        reads.append(seq)
        return await stored_since(seq, limit=limit)

    events.stored_since = counted  # type: ignore[method-assign]
    streams = [stub.WatchEvents(pb.WatchEventsRequest(since_seq=0)) for _ in range(5)]
    for stream in streams:
        assert [e.seq for e in await take(stream, 1900)] == list(range(1, 1901))
        stream.cancel()
    assert len(reads) == len(set(reads))  # every page read from the store once
