"""The kubelet device plugin's allocations as durable facts, on the real store: Allocate
answers only once its record is on disk (a held write holds the answer, a failed one
refuses it and hands nothing out), two Allocates never get the same lease while a write
is in flight, a caller that goes away leaves the lease handed out, the book is read back
by the next agent, and the pruner drops the records of ended leases."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from agent.config.kubelet import KubeletSettings
from agent.core.types import AdmissionRequest, PriorityClass
from agent.core.units import GIB
from agent.legacy.deviceplugin.kubelet.port import AllocationRefused, ContainerAllocation
from agent.legacy.deviceplugin.podalloc import PodAllocator
from agent.legacy.deviceplugin.records import AllocationKind, AllocationRecord
from agent.node.events import EventLog
from agent.node.service import NodeService
from agent.state.migrations import MIGRATIONS, schema_version
from agent.state.port import Retention, WriteBatch
from agent.state.sqlite import SqliteStateStore
from tests.helpers import FakeClock
from tests.integration.state.races import ControlledStore, Setup, clocked_node

ALLOCATED, DEFERRED = AllocationKind.ALLOCATED, AllocationKind.DEFERRED


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    async with clocked_node(tmp_path) as found:
        yield found


async def no_pod(_units: Sequence[str]) -> str | None:
    raise AssertionError("PreStartContainer is not part of these tests")


def allocator(
    node: NodeService, store: ControlledStore, events: EventLog, clock: FakeClock
) -> PodAllocator:
    settings = KubeletSettings(enabled=True, slots=4, hold_s=30.0)
    return PodAllocator(node, events, settings, store=store, pod_of_units=no_pod, clock=clock)


async def admit(node: NodeService, clock: FakeClock, pod: str) -> str:
    """A pod lease, a second before the next one (bind order is admission order)."""
    request = AdmissionRequest(
        f"uid-{pod}", "t", "t", PriorityClass.BURSTABLE, 2 * GIB, 10, pod=f"ns/{pod}"
    )
    result = await node.admit(request)
    assert result.lease is not None
    clock.advance(1.0)
    return result.lease.lease_id


def lease_of(answer: ContainerAllocation) -> str:
    return answer.envs["GPUSHARE_LEASE_ID"]


def told(events: EventLog) -> list[str | None]:
    return [e.lease_id for e in events.since(0) if e.kind == "lease.allocated"]


async def test_allocate_answers_only_once_its_record_is_durable(setup: Setup) -> None:
    node, store, events, clock = setup
    plugin = allocator(node, store, events, clock)
    lease = await admit(node, clock, "a")
    store.hold()  # a slow disk
    answer = asyncio.create_task(plugin.allocate(["share-2"]))
    await asyncio.sleep(0.2)
    assert not answer.done() and lease not in told(events)
    store.release()
    assert lease_of(await answer) == lease
    assert lease in told(events)  # the event came with the record
    assert await store.allocation_records() == [
        AllocationRecord(ALLOCATED, clock(), lease, ("share-2",))
    ]


async def test_a_failed_write_refuses_the_allocate_and_hands_nothing_out(setup: Setup) -> None:
    node, store, events, clock = setup
    plugin = allocator(node, store, events, clock)
    lease = await admit(node, clock, "a")
    store.fail_writes = 1  # a full disk
    with pytest.raises(AllocationRefused, match="cannot record the allocation"):
        await plugin.allocate(["share-0"])
    assert await store.allocation_records() == [] and lease not in told(events)
    assert lease_of(await plugin.allocate(["share-1"])) == lease  # still waiting


async def test_two_allocates_while_a_write_is_held_get_two_leases(setup: Setup) -> None:
    node, store, events, clock = setup
    plugin = allocator(node, store, events, clock)
    first, second = await admit(node, clock, "a"), await admit(node, clock, "b")
    store.hold()
    answers = [asyncio.create_task(plugin.allocate([f"share-{i}"])) for i in (0, 1)]
    await asyncio.sleep(0.2)
    store.release()
    assert [lease_of(a) for a in await asyncio.gather(*answers)] == [first, second]


async def test_an_allocate_whose_caller_went_away_still_hands_its_lease_out(
    setup: Setup,
) -> None:
    """The kubelet's deadline passes while the write is held: the write goes on, and the
    lease it hands out is never given to the next Allocate."""
    node, store, events, clock = setup
    plugin = allocator(node, store, events, clock)
    first, second = await admit(node, clock, "a"), await admit(node, clock, "b")
    store.hold()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(plugin.allocate(["share-0"]), 0.1)
    later = asyncio.create_task(plugin.allocate(["share-1"]))
    await asyncio.sleep(0.1)
    store.release()
    assert lease_of(await later) == second
    assert [r.lease_id for r in await store.allocation_records()] == [first, second]


async def test_the_next_agent_reads_the_book_back(setup: Setup) -> None:
    node, store, events, clock = setup
    first, second = await admit(node, clock, "a"), await admit(node, clock, "b")
    await allocator(node, store, events, clock).allocate(["share-0"])
    restarted = allocator(node, store, events, clock)  # the same store, a new agent
    await restarted.load()
    assert lease_of(await restarted.allocate(["share-1"])) == second
    with pytest.raises(AllocationRefused, match="no pod lease waits"):
        await restarted.allocate(["share-2"])
    assert first in told(events)


async def test_records_of_ended_leases_and_stale_deferrals_are_pruned(setup: Setup) -> None:
    node, store, events, clock = setup
    plugin = allocator(node, store, events, clock)
    ended, kept = await admit(node, clock, "a"), await admit(node, clock, "b")
    await plugin.allocate(["share-0"])
    await plugin.allocate(["share-1"])
    deferred = [
        # handed out again since, to a lease now gone: neither is left (the deferral must
        # not outlive what replaced it, or share-2 would skip its PodResources check)
        AllocationRecord(DEFERRED, clock(), units=("share-2",)),
        AllocationRecord(ALLOCATED, clock(), "gone", ("share-2",)),
        AllocationRecord(DEFERRED, clock(), units=("share-3",)),  # deferred again since
        AllocationRecord(DEFERRED, clock(), units=("share-3",)),  # past the bound of two
        AllocationRecord(DEFERRED, clock(), units=("share-0", "share-1")),
        AllocationRecord(DEFERRED, clock(), units=("share-0",)),
    ]
    await store.commit(WriteBatch(allocations=deferred))
    await node.release(ended)
    pruned = await store.prune(now=clock(), retention=Retention(max_deferred=2))
    assert pruned.allocations == 5
    assert await store.allocation_records() == [
        AllocationRecord(ALLOCATED, clock(), kept, ("share-1",)),
        AllocationRecord(DEFERRED, clock(), units=("share-0", "share-1")),
        AllocationRecord(DEFERRED, clock(), units=("share-0",)),
    ]


async def test_a_store_at_schema_8_gains_the_allocations_table(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path, isolation_level=None)
    schema_version(db)
    for version, script in enumerate(MIGRATIONS[:8], start=1):
        db.executescript(f"BEGIN; {script}; INSERT INTO schema_version VALUES ({version}); COMMIT;")
    db.close()
    store = SqliteStateStore(str(path))
    await store.start()
    try:
        record = AllocationRecord(ALLOCATED, 1.0, "l-1", ("share-10", "share-9"), "ns/p")
        await store.commit(WriteBatch(allocations=[record]))
        [back] = await store.allocation_records()
        assert back == record._replace(units=("share-10", "share-9"))  # sorted as text
    finally:
        await store.aclose()
    db = sqlite3.connect(path)
    assert schema_version(db) == len(MIGRATIONS) == 11
    db.close()
