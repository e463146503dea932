"""Callers that go away and background tasks that race, driven on the real store the way
they were seen: a deadline while a write is held on the store's thread (a slow disk), the
reservation reaper expiring a member while a commit waits for its write, a write that
fails under an explanation. Each broke a promise of the ledger before it was mended."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.core.errors import ConflictError, StateError
from agent.core.lease import Lease, LeaseState
from agent.core.types import PriorityClass
from agent.node.service import NodeService
from tests.integration.state.races import (
    DEVICE,
    Ledger,
    open_node,
    request,
    settle,
)

BE, B, G = PriorityClass.BEST_EFFORT, PriorityClass.BURSTABLE, PriorityClass.GUARANTEED


async def quiet(node: NodeService) -> None:
    """Until no write of the ledger is in flight."""
    while node.ledger.pinned():
        await asyncio.sleep(0.01)


def frozen_clock(node: NodeService) -> list[float]:
    """The node's clock, moved by the test: ``now[0] += seconds``."""
    now = [1000.0]
    node.transitions._clock = lambda: now[0]  # type: ignore[method-assign]
    node.admissions._clock = lambda: now[0]  # type: ignore[method-assign]
    return now


async def gang_with_one_member_due(node: NodeService) -> tuple[Lease, Lease]:
    """Gang ``g`` of two reserved members, the first past its TTL (the reaper's next)."""
    now = frozen_clock(node)
    short = (await node.admit(request("m1", 5), gang_id="g", ttl_s=1.0)).lease
    long = (await node.admit(request("m2", 5), gang_id="g", ttl_s=100.0)).lease
    assert short is not None and long is not None
    now[0] += 2.0
    return short, long


def committed_bytes(leases: object) -> int:
    return sum(x.memory_bytes for x in leases)  # type: ignore[attr-defined]


async def test_a_preempting_admit_cut_by_its_deadline_keeps_the_ledger_until_durable(
    ledger: Ledger,
) -> None:
    """The caller's deadline passes while the preempting write is held: the write goes on
    and nothing is decided against the victim's memory until it is durable."""
    node, store, _events = ledger
    await node.admit(request("other", 20, B))
    victim = (await node.admit(request("victim", 30, BE))).lease
    assert victim is not None
    store.hold()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(node.admit(request("g", 45, G)), 0.1)
    late = asyncio.create_task(node.admit(request("late", 25, B)))
    await settle()
    store.release()
    answer = await late
    await quiet(node)
    assert not answer.decision.admitted, "decided against memory being preempted"
    for leases in (node.leases.values(), await store.live_leases()):
        assert committed_bytes(leases) <= DEVICE.memory_bytes
    retry = await node.admit(request("g", 45, G))
    assert retry.lease is not None and retry.lease.state is LeaseState.ADMITTED
    assert victim.lease_id not in node.leases


async def test_a_commit_racing_the_reaper_commits_no_part_of_the_gang(ledger: Ledger) -> None:
    """The reaper expires one member while the commit waits behind its write: the commit
    answers that the gang expired, naming the member, and commits none of it."""
    node, store, _events = ledger
    short, long = await gang_with_one_member_due(node)
    store.hold()
    reaper = asyncio.create_task(node.transitions.reaper_round(heartbeat=False))
    await settle()
    commit = asyncio.create_task(node.commit("g"))
    await settle()
    store.release()
    await reaper
    with pytest.raises(ConflictError, match=short.lease_id):
        await commit
    stored = await store.lease(long.lease_id)
    assert stored is not None and stored.state is LeaseState.EXPIRED
    assert long.lease_id not in node.leases


async def test_a_commit_after_the_reaper_expired_a_member_commits_none(ledger: Ledger) -> None:
    """The member expired is gone from the ledger; the one left is not overdue: the
    round's record of its loss is what refuses the commit."""
    node, _store, _events = ledger
    short, long = await gang_with_one_member_due(node)
    assert [x.lease_id for x in await node.expire_reservations()] == [short.lease_id]
    with pytest.raises(ConflictError, match=short.lease_id):
        await node.commit("g")
    assert long.lease_id not in node.leases


async def test_a_gang_committed_before_is_not_held_by_a_later_round(ledger: Ledger) -> None:
    """Members committed and running do not keep the gang's round open: a later try whose
    reservation was aborted leaves the id free, and a commit asked again answers the
    members committed."""
    node, _store, _events = ledger
    first = [(await node.admit(request(f"m{i}", 5), gang_id="g")).lease for i in range(2)]
    assert {x.lease_id for x in await node.commit("g")} == {x.lease_id for x in first if x}
    await node.admit(request("later", 5), gang_id="g")
    await node.abort("g")
    again = await node.commit("g")
    assert {x.lease_id for x in again} == {x.lease_id for x in first if x}
    retry = (await node.admit(request("retry", 5), gang_id="g")).lease
    assert retry is not None
    committed = await node.commit("g")
    assert [x.lease_id for x in committed] == [retry.lease_id]
    assert node.leases[retry.lease_id].state is LeaseState.ADMITTED


async def test_a_cancelled_commit_still_remembers_the_gang_expired(ledger: Ledger) -> None:
    """The gang's outcome is recorded with the write that ends it, not after the
    caller's await: a commit asked again answers the same."""
    node, store, _events = ledger
    now = frozen_clock(node)
    member = (await node.admit(request("m1", 5), gang_id="g", ttl_s=1.0)).lease
    assert member is not None
    now[0] += 2.0
    store.hold()
    commit = asyncio.create_task(node.commit("g"))
    await settle()
    commit.cancel()
    await asyncio.gather(commit, return_exceptions=True)
    store.release()
    await quiet(node)
    with pytest.raises(ConflictError, match=f"expired before it was committed.*{member.lease_id}"):
        await node.commit("g")


async def test_a_gang_that_lost_a_member_stays_uncommittable_across_a_restart(
    tmp_path: Path,
) -> None:
    node, store, _events = await open_node(tmp_path)
    lost = (await node.admit(request("m1", 5), gang_id="g")).lease
    kept = (await node.admit(request("m2", 5), gang_id="g")).lease
    assert lost is not None and kept is not None
    await node.release(lost.lease_id)
    await store.aclose()
    node, store, _events = await open_node(tmp_path)
    try:
        with pytest.raises(ConflictError, match=lost.lease_id):
            await node.commit("g")
        stored = await store.lease(kept.lease_id)
        assert stored is not None and stored.state is LeaseState.EXPIRED
    finally:
        await store.aclose()


async def test_a_gang_id_with_no_member_reserved_starts_a_new_round(ledger: Ledger) -> None:
    node, _store, _events = ledger
    now = frozen_clock(node)
    await node.admit(request("m1", 5), gang_id="g", ttl_s=1.0)
    now[0] += 2.0
    await node.expire_reservations()
    again = (await node.admit(request("m1-again", 5), gang_id="g")).lease
    assert again is not None
    (committed,) = await node.commit("g")
    assert committed.lease_id == again.lease_id and committed.state is LeaseState.ADMITTED


async def test_a_device_gone_event_is_written_only_with_its_failed_lease(ledger: Ledger) -> None:
    node, store, events = ledger
    heard: list[str] = []
    events.listeners.append(lambda event: heard.append(event.kind))
    lease = (await node.admit(request("r", 10))).lease
    assert lease is not None
    store.fail_writes = 1
    with pytest.raises(StateError):
        await node.fail_leases_of_gone_devices([DEVICE.uuid])
    await events.flush()
    assert "lease.device_gone" not in heard
    assert [e.kind for e in await store.events_since(0, limit=100)] == ["lease.admitted"]
    assert node.leases[lease.lease_id].state is LeaseState.ADMITTED
    await node.fail_leases_of_gone_devices([DEVICE.uuid])
    await events.flush()
    kinds = [e.kind for e in await store.events_since(0, limit=100) if e.lease_id]
    assert kinds == ["lease.admitted", "lease.device_gone", "lease.failed"]
    assert [e.kind for e in events.since(0)][-2:] == ["lease.device_gone", "lease.failed"]


async def test_a_drain_whose_caller_goes_away_is_drained_on_disk_and_in_memory(
    ledger: Ledger,
) -> None:
    """The CLI's Ctrl-C while the drain's write is held: the write lands, and the device
    is closed in memory too (it was drained on disk and open until a restart)."""
    node, store, _events = ledger
    store._lock.acquire()  # the store's thread waits for the connection: a slow disk
    try:
        drain = asyncio.create_task(node.drain(DEVICE.uuid, "maintenance"))
        await settle()
        drain.cancel()
        await asyncio.gather(drain, return_exceptions=True)
    finally:
        store._lock.release()  # the write goes on, its caller gone
    async with asyncio.timeout(5):
        while DEVICE.uuid not in node.drained:
            await asyncio.sleep(0.01)
    assert await store.drained() == {DEVICE.uuid: "maintenance"}
    answer = await node.admit(request("after", 5))
    assert not answer.decision.admitted
