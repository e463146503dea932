"""The ledger's hard cases, on the real SQLite store: writes that fail or are abandoned,
retries in flight, preemption undone, ended request ids, restarts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.admission.policy import Rules
from agent.core.errors import ConflictError, StateError
from agent.core.lease import LeaseState
from agent.core.mpsstate import MpsDaemonState
from agent.core.types import AdmissionRequest, Device, PriorityClass, ReasonCode
from agent.core.units import GIB
from agent.node.events import EventLog
from agent.node.service import NodeService
from agent.state.sqlite import SqliteStateStore

DEVICE = Device("GPU-0", 0, "H100", 80 * GIB)
RULES = Rules(reserve_bytes=0, context_overhead_bytes=0)


class FlakyStore(SqliteStateStore):
    """The real store, with a switch that makes writes fail or stall."""

    fail = False
    stall: asyncio.Event | None = None

    def _write(self, batches):  # type: ignore[no-untyped-def]
        if self.fail:
            raise StateError("disk full")
        super()._write(batches)

    async def commit(self, batch):  # type: ignore[no-untyped-def]
        if self.stall is not None:
            await self.stall.wait()
        return await super().commit(batch)


async def open_node(path: Path) -> tuple[NodeService, FlakyStore, EventLog]:
    store = FlakyStore(str(path / "state.db"))
    await store.start()
    events = EventLog()
    await events.resume(store)
    node = NodeService(
        [DEVICE],
        store=store,
        events=events,
        rules=RULES,
        sizes=[],
        mps_root="/run/mps",
        mps_states=lambda: [MpsDaemonState("GPU-0", True, "x")],
        clock=time.time,
        reservation_ttl_s=30,
    )
    await node.load()
    return node, store, events


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[tuple[NodeService, FlakyStore, EventLog]]:
    node, store, events = await open_node(tmp_path)
    yield node, store, events
    await store.aclose()


def request(
    request_id: str,
    memory_gib: float,
    priority: PriorityClass = PriorityClass.BURSTABLE,
) -> AdmissionRequest:
    return AdmissionRequest(request_id, "t", "a", priority, int(memory_gib * GIB), 10.0)


async def test_a_duplicate_waits_for_the_first_write_and_shares_its_fate(ledger: tuple) -> None:  # type: ignore[type-arg]
    node, store, _events = ledger
    store.stall = asyncio.Event()
    first = asyncio.create_task(node.admit(request("r1", 10)))
    await asyncio.sleep(0.05)
    duplicate = asyncio.create_task(node.admit(request("r1", 10)))
    await asyncio.sleep(0.05)
    assert not duplicate.done(), "no answer before the lease is on disk"
    store.fail = True
    store.stall.set()
    store.stall = None
    assert (await first).decision.reason is ReasonCode.STORE_UNAVAILABLE
    assert (await duplicate).decision.reason is ReasonCode.STORE_UNAVAILABLE
    assert not node.leases


async def test_a_cancelled_caller_leaves_its_write_to_finish(ledger: tuple) -> None:  # type: ignore[type-arg]
    node, store, _events = ledger
    store.stall = asyncio.Event()
    first = asyncio.create_task(node.admit(request("r2", 10)))
    await asyncio.sleep(0.05)
    first.cancel()  # a client deadline
    await asyncio.gather(first, return_exceptions=True)
    store.stall.set()
    store.stall = None
    retry = await node.admit(request("r2", 10))
    assert retry.decision.admitted and retry.lease is not None
    assert (await store.lease_by_request("r2")) == retry.lease


async def test_a_failed_preemption_restores_the_victims_without_overcommit(ledger: tuple) -> None:  # type: ignore[type-arg]
    node, store, _events = ledger
    victim = await node.admit(request("be", 60, PriorityClass.BEST_EFFORT))
    assert victim.lease is not None
    store.fail = True
    guaranteed = await node.admit(request("g", 50, PriorityClass.GUARANTEED))
    assert guaranteed.decision.reason is ReasonCode.STORE_UNAVAILABLE
    store.fail = False
    assert node.leases[victim.lease.lease_id].state is LeaseState.ADMITTED
    committed = sum(x.memory_bytes for x in node.leases.values())
    assert committed <= DEVICE.memory_bytes


async def test_a_reserved_best_effort_lease_is_never_a_victim(ledger: tuple) -> None:  # type: ignore[type-arg]
    node, _store, _events = ledger
    await node.admit(request("held", 60, PriorityClass.BEST_EFFORT), gang_id="gang", ttl_s=30)
    answer = await node.admit(request("g", 50, PriorityClass.GUARANTEED))
    assert not answer.decision.admitted and answer.decision.reason is ReasonCode.NO_MEMORY


async def test_a_failed_release_keeps_the_lease_and_release_is_idempotent(ledger: tuple) -> None:  # type: ignore[type-arg]
    node, store, _events = ledger
    lease = (await node.admit(request("r3", 10))).lease
    assert lease is not None
    store.fail = True
    with pytest.raises(StateError):
        await node.release(lease.lease_id)
    assert node.leases[lease.lease_id].state is LeaseState.ADMITTED
    store.fail = False
    released = await node.release(lease.lease_id)
    assert (await node.release(lease.lease_id)) == released


async def test_a_gang_with_an_expired_member_commits_nothing(ledger: tuple) -> None:  # type: ignore[type-arg]
    node, _store, _events = ledger
    await node.admit(request("m1", 10), gang_id="g", ttl_s=0.05)
    await node.admit(request("m2", 10), gang_id="g", ttl_s=30)
    await asyncio.sleep(0.1)
    await node.expire_reservations()
    with pytest.raises(ConflictError, match="expired"):
        await node.commit("g")
    assert not [x for x in node.leases.values() if x.gang_id == "g"]


async def test_ended_request_ids_are_refused_before_and_after_a_restart(tmp_path: Path) -> None:
    node, store, events = await open_node(tmp_path)
    lease = (await node.admit(request("once", 10))).lease
    assert lease is not None
    await node.release(lease.lease_id)
    with pytest.raises(ConflictError, match="released"):
        await node.admit(request("once", 10))
    seq_before, epoch_before = events.last_seq, events.epoch
    await store.aclose()
    node, store, events = await open_node(tmp_path)
    try:
        with pytest.raises(ConflictError, match="released"):
            await node.admit(request("once", 10))
        events("test", "after restart")
        assert await events.flush()
        (event,) = events.since(seq_before)
        assert event.seq == seq_before + 1, "numbers stay dense across a restart"
        assert event.epoch == epoch_before + 1, "the epoch tells the restart"
    finally:
        await store.aclose()
