"""Interleavings that broke the ledger's promises, each driven on the real store with writes
held on the store's thread (a slow sync) or failed (a full disk)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.core.errors import AlreadyExistsError, ConflictError, StateError
from agent.core.lease import LeaseState
from agent.core.types import PriorityClass, ReasonCode
from agent.node.service import NodeService
from tests.integration.state.races import (
    DEVICE,
    ControlledStore,
    Ledger,
    open_node,
    request,
    settle,
)

BE, G = PriorityClass.BEST_EFFORT, PriorityClass.GUARANTEED


async def lease_kinds(store: ControlledStore, lease_id: str) -> list[str]:
    return [e.kind for e in await store.events_since(0, limit=10_000) if e.lease_id == lease_id]


def committed_bytes(node: NodeService) -> int:
    return sum(x.memory_bytes for x in node.leases.values())


async def test_abort_and_commit_racing_behind_a_preempting_write_leave_one_outcome(
    ledger: Ledger,
) -> None:
    node, store, _events = ledger
    members = [await node.admit(request(f"m{i}", 5), gang_id="g") for i in range(2)]
    await node.admit(request("victim", 60, BE))
    store.hold()
    preempting = asyncio.create_task(node.admit(request("g1", 50, G)))
    await settle()
    abort = asyncio.create_task(node.abort("g"))
    commit = asyncio.create_task(node.commit("g"))
    await settle()
    store.release()
    assert (await preempting).decision.preempted_lease_ids
    outcomes = await asyncio.gather(abort, commit, return_exceptions=True)
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1, outcomes
    assert all(isinstance(o, ConflictError) for o in outcomes if isinstance(o, BaseException))
    for member in members:
        assert member.lease is not None
        kinds = await lease_kinds(store, member.lease.lease_id)
        assert kinds in (
            ["lease.reserved", "lease.released"],
            ["lease.reserved", "lease.admitted"],
        ), kinds
        stored = await store.lease(member.lease.lease_id)
        live = node.leases.get(member.lease.lease_id)
        assert stored is not None
        assert (live is not None) == stored.state.holds_capacity


async def test_concurrent_commits_answer_the_same_and_admit_once(ledger: Ledger) -> None:
    node, store, _events = ledger
    member = (await node.admit(request("m", 5), gang_id="g")).lease
    assert member is not None
    await node.admit(request("victim", 60, BE))
    store.hold()
    preempting = asyncio.create_task(node.admit(request("g1", 50, G)))
    await settle()
    first = asyncio.create_task(node.commit("g"))
    second = asyncio.create_task(node.commit("g"))
    await settle()
    store.release()
    one, two = await asyncio.gather(first, second)
    assert (await preempting).decision.preempted_lease_ids
    assert [x.lease_id for x in one] == [x.lease_id for x in two] == [member.lease_id]
    assert await lease_kinds(store, member.lease_id) == ["lease.reserved", "lease.admitted"]


async def test_concurrent_releases_end_the_lease_once(ledger: Ledger) -> None:
    node, store, _events = ledger
    lease = (await node.admit(request("r", 10))).lease
    assert lease is not None
    await node.admit(request("victim", 60, BE))
    store.hold()
    preempting = asyncio.create_task(node.admit(request("g1", 50, G)))
    await settle()
    both = asyncio.gather(node.release(lease.lease_id), node.release(lease.lease_id))
    await settle()
    store.release()
    one, two = await both
    assert (await preempting).decision.preempted_lease_ids
    assert one == two and one.state is LeaseState.RELEASED
    assert await lease_kinds(store, lease.lease_id) == ["lease.admitted", "lease.released"]


async def test_a_stale_readiness_copy_never_revives_a_released_lease(ledger: Ledger) -> None:
    node, store, _events = ledger
    lease = (await node.admit(request("r", 10))).lease
    assert lease is not None
    copy = node.leases[lease.lease_id]  # what the readiness watcher read
    await node.release(lease.lease_id)
    assert await node.mark_ready(copy, [4242]) is None
    assert lease.lease_id not in node.leases
    stored = await store.lease(lease.lease_id)
    assert stored is not None and stored.state is LeaseState.RELEASED


async def test_a_lease_whose_write_is_in_flight_is_never_a_victim_and_a_failure_leaves_nothing(
    ledger: Ledger,
) -> None:
    node, store, _events = ledger
    store.hold()
    store.fail_writes = 1
    victim = asyncio.create_task(node.admit(request("v", 60, BE)))
    await settle()
    preempting = asyncio.create_task(node.admit(request("g", 50, G)))
    await settle()
    store.release()
    assert (await victim).decision.reason is ReasonCode.STORE_UNAVAILABLE
    answer = await preempting
    assert not answer.decision.preempted_lease_ids
    assert {x.request_id for x in node.leases.values()} == {
        x.request_id for x in await store.live_leases()
    }
    retry = await node.admit(request("v", 60, BE))
    assert retry.decision.message != "already admitted (same request id)"


async def test_capacity_comes_back_only_once_the_freeing_write_is_durable(ledger: Ledger) -> None:
    node, store, _events = ledger
    held = (await node.admit(request("a", 60))).lease
    assert held is not None
    store.hold()
    store.fail_writes = 1
    release = asyncio.create_task(node.release(held.lease_id))
    await settle()
    taker = await node.admit(request("b", 60))
    assert not taker.decision.admitted and taker.decision.reason is ReasonCode.NO_MEMORY
    store.release()
    with pytest.raises(StateError):
        await release
    assert node.leases[held.lease_id].state is LeaseState.ADMITTED
    assert committed_bytes(node) <= DEVICE.memory_bytes
    assert node.ledger.tally(DEVICE.uuid).memory_bytes == committed_bytes(node)


async def test_the_reaper_meeting_a_commit_in_flight_neither_raises_nor_expires_it(
    ledger: Ledger,
) -> None:
    node, store, _events = ledger
    member = (await node.admit(request("m", 5), gang_id="g", ttl_s=0.2)).lease
    assert member is not None
    store.hold()
    commit = asyncio.create_task(node.commit("g"))
    await asyncio.sleep(0.3)  # the TTL passes while the commit is being written
    reaper = asyncio.create_task(node.transitions.reaper_round(heartbeat=False))
    await settle()
    store.release()
    (committed,) = await commit
    await reaper
    assert node.leases[member.lease_id].state is LeaseState.ADMITTED
    assert committed.state is LeaseState.ADMITTED


async def test_a_batch_with_an_ended_request_id_answers_every_item(ledger: Ledger) -> None:
    node, _store, _events = ledger
    ended = (await node.admit(request("old", 5))).lease
    assert ended is not None
    await node.release(ended.lease_id)
    batch = await node.admit_batch([request("n1", 5), request("old", 5), request("n2", 5)])
    first, again, second = batch.results
    assert first.decision.admitted and second.decision.admitted
    assert isinstance(again.error, ConflictError) and "released" in str(again.error)
    assert {first.lease.request_id, second.lease.request_id} <= {  # type: ignore[union-attr]
        x.request_id for x in node.leases.values()
    }


@pytest.mark.parametrize(
    "change",
    [
        {"memory_gib": 20},
        {"priority": PriorityClass.GUARANTEED},
        {"thread_pct": 50.0},
        {"run_as_uid": 1000},
    ],
)
async def test_a_request_id_reused_for_another_request_is_already_exists(
    ledger: Ledger, change: dict[str, object]
) -> None:
    node, _store, _events = ledger
    await node.admit(request("same", 10))
    values: dict[str, object] = {"memory_gib": 10} | change
    with pytest.raises(AlreadyExistsError, match="another request"):
        await node.admit(request("same", **values))  # type: ignore[arg-type]


async def test_request_ids_are_scoped_per_tenant(ledger: Ledger) -> None:
    node, _store, _events = ledger
    mine = (await node.admit(request("same", 10, tenant="a"))).lease
    theirs = (await node.admit(request("same", 10, tenant="b"))).lease
    assert mine is not None and theirs is not None
    assert mine.lease_id != theirs.lease_id and theirs.tenant == "b"


async def test_events_are_published_only_after_their_write(ledger: Ledger) -> None:
    node, store, events = ledger
    store.hold()
    admit = asyncio.create_task(node.admit(request("r", 10)))
    events("device.drained", "an observation while the lease write is held")
    await settle()
    assert events.since(0) == [], "nothing is told before it is durable"
    store.release()
    lease = (await admit).lease
    assert lease is not None and await events.flush()
    published = events.since(0)
    stored = await store.events_since(0, limit=100)
    assert published == stored
    assert [e.seq for e in published] == list(range(1, len(published) + 1))


async def test_a_rolled_back_admission_publishes_nothing(ledger: Ledger) -> None:
    node, store, events = ledger
    store.fail_writes = 1
    answer = await node.admit(request("r", 10))
    assert answer.decision.reason is ReasonCode.STORE_UNAVAILABLE
    assert events.since(0) == [] and await store.events_since(0, limit=10) == []
    await store.heartbeat(at=0)
    ok = await node.admit(request("r", 10))
    assert ok.decision.admitted and [e.seq for e in events.since(0)] == [1]


async def test_a_clean_stop_writes_the_observations_it_holds(tmp_path: Path) -> None:
    _node, store, events = await open_node(tmp_path)
    for i in range(5):
        events("test.observed", f"observation {i}")
    assert await events.flush()
    await store.aclose()
    _node, store, _events = await open_node(tmp_path)
    try:
        kinds = [e.kind for e in await store.events_since(0, limit=100)]
        assert kinds.count("test.observed") == 5
    finally:
        await store.aclose()


async def test_an_expired_gang_stays_expired_across_a_restart(tmp_path: Path) -> None:
    node, store, _events = await open_node(tmp_path)
    await node.admit(request("m", 5), gang_id="g", ttl_s=0.05)
    await asyncio.sleep(0.1)
    await node.expire_reservations()
    await store.aclose()
    node, store, _events = await open_node(tmp_path)
    try:
        with pytest.raises(ConflictError, match="expired"):
            await node.commit("g")
    finally:
        await store.aclose()


async def test_every_table_is_pruned_by_time(tmp_path: Path) -> None:
    now = [1000.0]
    node, store, _events = await open_node(tmp_path, clock=lambda: now[0])
    try:
        lease = (await node.admit(request("r", 10))).lease
        assert lease is not None
        await node.release(lease.lease_id)
        live = (await node.admit(request("live", 10))).lease
        now[0] += node.retention.ended_s + 1
        await node.prune_once()
        assert await store.lease(lease.lease_id) is None
        assert await store.request_record("t", "r") is None
        assert await store.events_since(0, limit=10) == []
        assert live is not None and await store.request_record("t", "live") is not None
        again = await node.admit(request("r", 10))
        assert again.decision.admitted, "an id past its retention may be used again"
    finally:
        await store.aclose()
