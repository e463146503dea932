"""The agents' cache asks an agent's ledger again after a burst of events that may move
capacity, ledger only, and not after an allocation (the lease reached its container); a
refused token ends the connection, and the next one reads the token again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.client import TokenFile
from agent.legacy.cluster import cache as cache_module
from agent.legacy.cluster.cache import AgentCache, NodeEntry
from agent.legacy.cluster.service import ClusterOptions, connector
from agent.legacy.cluster.views import lease_of


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


def granted(lease_id: str, state: str = "admitted", pod_uid: str = "u-1") -> pb.Lease:
    return pb.Lease(
        lease_id=lease_id,
        request_id=pod_uid,
        device_uuid="GPU-0",
        state=state,
        priority="burstable",
        pod=f"ns/{pod_uid}",
        memory_bytes=2**30,
    )


@contextlib.asynccontextmanager
async def following(link: Link) -> AsyncIterator[tuple[AgentCache, NodeEntry]]:
    cache = AgentCache(lambda target: None)  # type: ignore[arg-type,return-value]
    entry = cache.nodes["n1"] = NodeEntry("n1", "127.0.0.1:1")
    task = asyncio.create_task(cache._serve(entry, link))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.05)
        assert link.asked == [True]  # at connect, ledger only
        yield cache, entry
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# (what this side holds pending, the event, GetNodes it brings about)
EVENTS = [
    pytest.param(None, "lease.admitted", 1, id="a lease granted to another caller"),
    pytest.param("admitted", "lease.admitted", 0, id="the grant of this side's bind"),
    pytest.param(None, "lease.reserved", 1, id="a reservation (a gang's is held after it)"),
    pytest.param("reserved", "lease.admitted", 1, id="a gang's commit"),
    pytest.param("admitted", "lease.ready", 1, id="a lease turned ready"),
    pytest.param("admitted", "lease.allocated", 0, id="an allocation (no capacity moved)"),
    pytest.param("admitted", "lease.released", 0, id="a release (counted off at once)"),
    pytest.param("admitted", "lease.evicted", 0, id="an eviction (counted off at once)"),
    pytest.param(None, "device.drained", 1, id="a device's change"),
]


@pytest.mark.parametrize(("held", "kind", "asks"), EVENTS)
async def test_only_events_this_side_cannot_account_for_ask_the_agent(
    held: str | None, kind: str, asks: int
) -> None:
    link = Link()
    async with following(link) as (cache, _):
        if held is not None:
            cache.add_pending("n1", lease_of(granted("l-a", held)))
        assert await settle(link, pb.Event(seq=1, kind=kind, lease_id="l-a")) == asks
        assert all(link.asked)
        assert cache_module.COALESCE_S < 0.05


async def test_a_grant_seen_before_its_bind_holds_it_is_accounted_for_in_the_burst() -> None:
    """The event stream may bring the grant before the bind's answer: within the burst's
    delay the bind holds it, and no GetNode is needed."""
    link = Link()
    async with following(link) as (cache, _):
        link.events.put_nowait(pb.Event(seq=1, kind="lease.admitted", lease_id="l-a"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        cache.add_pending("n1", lease_of(granted("l-a")))
        await asyncio.sleep(0.1)
        assert link.asked == [True]


async def test_a_lease_given_back_by_a_failed_bind_is_asked_about() -> None:
    """Its Release may have failed: only the agent can say it is gone."""
    link = Link()
    async with following(link) as (cache, _):
        cache.add_pending("n1", lease_of(granted("l-a")))
        cache.drop_pending("n1", "l-a")
        await asyncio.sleep(0.1)
        assert link.asked == [True, True]


async def test_the_heartbeat_asks_with_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "HEARTBEAT_S", 0.05)
    link = Link()
    async with following(link):
        await asyncio.sleep(0.2)
        assert len(link.asked) >= 3


async def test_the_heartbeat_asks_under_a_steady_flow_of_own_grants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Events it accounts for, one every half heartbeat, do not put the heartbeat off."""
    monkeypatch.setattr(cache_module, "HEARTBEAT_S", 0.2)
    link = Link()
    async with following(link) as (cache, _):
        for n in range(16):
            cache.add_pending("n1", lease_of(granted(f"l-{n}")))
            link.events.put_nowait(pb.Event(seq=n + 1, kind="lease.admitted", lease_id=f"l-{n}"))
            await asyncio.sleep(0.1)
        assert len(link.asked) >= 1 + 6  # 1.6 s: at connect, then every 0.2 s or so


async def test_a_hidden_lease_that_ends_is_asked_about_and_the_others_still_count() -> None:
    """Without the observer role, another caller's leases come with no id, in answers and
    events alike: the end of one of them says nothing of which, so the agent is asked."""
    hidden = [granted("", pod_uid="u-1"), granted("", pod_uid="u-2")]
    link = Answering(*hidden)
    async with following(link) as (cache, entry):
        assert len(cache.live_leases("n1")) == 2
        link.leases = hidden[:1]
        assert await settle(link, link.send("lease.released", "")) == 1
        assert entry.ended == {}
        assert sum(len(v.leases) for v in cache.views("n1") or []) == 1


async def test_a_new_connection_forgets_what_the_last_one_heard() -> None:
    """Its answer has it all (or the agent's state was wiped and its seqs began again)."""
    link = Answering(granted("l-a"))
    cache = AgentCache(lambda target: None)  # type: ignore[arg-type,return-value]
    entry = cache.nodes["n1"] = NodeEntry("n1", "127.0.0.1:1")
    entry.ended, entry.granted, entry.must_ask = {"l-a": 900}, {"l-b": "admitted"}, True
    task = asyncio.create_task(cache._serve(entry, link))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.1)
        assert (entry.ended, entry.granted) == ({}, {})
        assert counted(cache) == {"l-a"}
        assert link.asked == [True]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_grant_whose_end_came_first_is_not_counted() -> None:
    """Evicted at once (a guaranteed Admit right after): the end event beat the answer."""
    link = Answering()
    async with following(link) as (cache, entry):
        await settle(link, link.send("lease.evicted", "l-a"))
        cache.add_pending("n1", lease_of(granted("l-a")))
        assert "l-a" not in entry.pending and counted(cache) == set()


class Answering(Link):
    """Answers with the leases it is given, and the seq of the last event it sent."""

    def __init__(self, *leases: pb.Lease) -> None:
        super().__init__()
        self.leases = list(leases)
        self.seq = 0

    async def get_node(self, *, ledger_only: bool = False) -> pb.GetNodeResponse:
        self.asked.append(ledger_only)
        device = pb.Device(uuid="GPU-0", memory_bytes=80 * 2**30, sharing_mode="mps")
        return pb.GetNodeResponse(devices=[device], leases=self.leases, last_event_seq=self.seq)

    def send(self, kind: str, lease_id: str) -> pb.Event:
        self.seq += 1
        return pb.Event(seq=self.seq, kind=kind, lease_id=lease_id)


def counted(cache: AgentCache) -> set[str]:
    views = cache.views("n1") or []
    return {x.lease_id for view in views for x in view.leases}


async def test_a_lease_ended_since_the_answer_is_not_counted_until_an_answer_drops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cache_module, "HEARTBEAT_S", 0.3)
    link = Answering(granted("l-a", pod_uid="u-1"), granted("l-b", pod_uid="u-2"))
    async with following(link) as (cache, entry):
        cache.assume("n1", lease_of(granted("assumed-u-3", pod_uid="u-3")), until=1e18)
        cache.add_pending("n1", lease_of(granted("l-c", pod_uid="u-4")))
        assert counted(cache) == {"l-a", "l-b", "l-c", "assumed-u-3"}
        assert {x.lease_id for x in cache.live_leases("n1")} == {"l-a", "l-b", "l-c"}
        assert await settle(link, link.send("lease.released", "l-a")) == 0
        assert counted(cache) == {"l-b", "l-c", "assumed-u-3"}
        assert {x.lease_id for x in cache.live_leases("n1")} == {"l-b", "l-c"}
        assert entry.snapshot is not None and len(entry.snapshot.leases) == 2  # as answered
        link.leases = [granted("l-b", pod_uid="u-2"), granted("l-c", pod_uid="u-4")]
        await asyncio.sleep(0.4)  # the heartbeat's answer, past the release
        assert len(link.asked) == 2
        assert entry.ended == {} and "l-c" not in entry.pending
        assert counted(cache) == {"l-b", "l-c", "assumed-u-3"}


async def test_an_answer_older_than_an_end_keeps_it_off() -> None:
    """An answer that left before the end event (its seq below it) still shows the lease:
    it stays off until an answer past the event."""
    link = Answering(granted("l-a"))
    async with following(link) as (cache, entry):
        link.seq = 0  # the next answer says it saw no event
        link.events.put_nowait(pb.Event(seq=5, kind="lease.released", lease_id="l-a"))
        await settle(link, pb.Event(seq=6, kind="device.drained", lease_id=""))
        assert len(link.asked) == 2 and entry.ended == {"l-a": 5}
        assert counted(cache) == set()
        link.seq, link.leases = 6, []
        await settle(link, pb.Event(seq=7, kind="device.drained", lease_id=""))
        assert entry.ended == {} and counted(cache) == set()


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


async def test_a_lease_both_answered_and_pending_is_live_once() -> None:
    """Between a connect's answer and the next one, a bind's lease may be in both."""
    link = Answering(granted("l-a"))
    async with following(link) as (cache, _):
        cache.add_pending("n1", lease_of(granted("l-a")))
        assert [x.lease_id for x in cache.live_leases("n1")] == ["l-a"]


@pytest.mark.parametrize("kind", ["lease.allocated", "lease.released", "lease.evicted"])
async def test_a_wait_for_an_allocation_ends_when_the_lease_is_allocated_or_ends(
    kind: str,
) -> None:
    """A bind waiting for the lease before it to be allocated goes on as soon as that lease
    is allocated, or ended (its pod gone: nothing is left to allocate), not a hold later."""
    link = Link()
    async with following(link) as (cache, _entry):
        waiting = asyncio.ensure_future(cache.wait_allocated("n1", "l-1", 30.0))
        await asyncio.sleep(0.05)
        link.events.put_nowait(pb.Event(seq=1, kind=kind, lease_id="l-1"))
        async with asyncio.timeout(2.0):
            assert await waiting is True
        async with asyncio.timeout(2.0):  # asked again afterwards: at once
            assert await cache.wait_allocated("n1", "l-1", 30.0) is True
