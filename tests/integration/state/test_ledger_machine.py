"""The ledger's promises explored: a hypothesis state machine drives admit, batches, gangs,
releases, readiness, expiry, preemption and races with held writes on the real store, with
write failures and restarts injected anywhere, and checks after every step that

- no device is committed past its memory, thread or client limits, and the ledger's
  running tallies equal the sums over its leases;
- the ledger equals the store (the same live leases, states and versions), so a restart
  restores exactly what was acknowledged;
- no lease that ended is ever live again;
- the event stream replayed from seq 0 is dense and ends, for every lease, in its stored
  state and version.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from agent.admission.policy import Rules, Tally
from agent.core.errors import GpushareError, LeaseTransitionError
from agent.core.lease import LeaseState
from agent.core.types import Device, PriorityClass
from agent.core.units import GIB
from tests.integration.state.races import open_node, request

DEVICES = (Device("GPU-0", 0, "H100", 80 * GIB), Device("GPU-1", 1, "H100", 40 * GIB))
RULES = Rules(
    reserve_bytes=0,
    context_overhead_bytes=GIB,
    thread_budget_pct=100.0,
    guaranteed_budget_pct=60.0,
    max_clients=4,
)
sizes = st.sampled_from([5, 10, 20, 35])
priorities = st.sampled_from(list(PriorityClass))
request_ids = st.sampled_from([f"r{i}" for i in range(12)])
tenants = st.sampled_from(["a", "b"])
threads = st.sampled_from([10.0, 25.0, 40.0])
gangs = st.sampled_from(["g1", "g2", "g3"])
picks = st.integers(0, 10_000)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-machine-"))
        self.now = [1000.0]
        self.ended: set[str] = set()
        self.acked: set[str] = set()
        self.node, self.store, self.events = self.run(self._open())

    async def _open(self) -> Any:
        return await open_node(self.dir, clock=lambda: self.now[0], devices=DEVICES, rules=RULES)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.store.release()
        self.run(self.store.aclose())
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    async def call(self, coro: Any) -> Any:
        try:
            return await coro
        except LeaseTransitionError:
            raise
        except GpushareError as exc:
            return exc

    def note(self, answer: Any) -> None:
        lease = getattr(answer, "lease", None)
        if lease is not None:
            self.acked.add(lease.lease_id)

    # -- the scheduler's calls --------------------------------------------------------------

    @rule(rid=request_ids, tenant=tenants, gib=sizes, priority=priorities, pct=threads)
    def admit(self, rid: str, tenant: str, gib: int, priority: PriorityClass, pct: float) -> None:
        req = dataclasses.replace(
            request(rid, gib, priority, tenant=tenant, thread_pct=pct), trust_domain=tenant
        )
        self.note(self.run(self.call(self.node.admit(req))))

    @rule(items=st.lists(st.tuples(request_ids, sizes, priorities), min_size=1, max_size=4))
    def admit_batch(self, items: list[tuple[str, int, PriorityClass]]) -> None:
        unique = {rid: (gib, p) for rid, gib, p in items}
        batch = [request(rid, gib, p, tenant="a") for rid, (gib, p) in unique.items()]
        answer = self.run(self.call(self.node.admit_batch(batch)))
        for result in getattr(answer, "results", ()):
            self.note(result)

    @rule(rid=request_ids, gang=gangs, gib=sizes, ttl=st.sampled_from([1.0, 5.0]))
    def reserve(self, rid: str, gang: str, gib: int, ttl: float) -> None:
        req = request(f"{gang}-{rid}", gib, tenant="a")
        self.note(self.run(self.call(self.node.admit(req, gang_id=gang, ttl_s=ttl))))

    @rule(gang=gangs)
    def commit(self, gang: str) -> None:
        self.run(self.call(self.node.commit(gang)))

    @rule(gang=gangs)
    def abort(self, gang: str) -> None:
        self.run(self.call(self.node.abort(gang)))

    def pick(self, ids: set[str], at: int) -> str | None:
        """A lease id by position (ids are random: drawing from them would not replay)."""
        ordered = sorted(ids)
        return ordered[at % len(ordered)] if ordered else None

    @rule(at=picks)
    def release(self, at: int) -> None:
        lease_id = self.pick(self.acked, at)
        if lease_id is not None:
            self.run(self.call(self.node.release(lease_id)))

    @rule(at=picks)
    def readiness(self, at: int) -> None:
        lease_id = self.pick(set(self.node.leases), at)
        if lease_id is not None:
            self.run(self.call(self.node.mark_ready(self.node.leases[lease_id], [4242])))

    @rule(seconds=st.sampled_from([0.5, 2.0, 10.0]))
    def time_passes(self, seconds: float) -> None:
        self.now[0] += seconds
        self.run(self.node.transitions.reaper_round(heartbeat=False))

    # -- races with held writes -------------------------------------------------------------

    @rule(at=picks, gang=gangs, rid=request_ids, gib=sizes, fail=st.booleans())
    def race(self, at: int, gang: str, rid: str, gib: int, fail: bool) -> None:
        lease_id = self.pick(self.acked, at) or "l-none"
        copy = self.node.leases.get(lease_id)
        calls = [
            self.node.release(lease_id),
            self.node.release(lease_id),
            self.node.commit(gang),
            self.node.abort(gang),
            self.node.admit(request(rid, gib, PriorityClass.GUARANTEED, tenant="b")),
            self.node.admit(request(rid, gib, PriorityClass.GUARANTEED, tenant="b")),
        ]
        if copy is not None:
            calls.append(self.node.mark_ready(copy, [4243]))

        async def together() -> None:
            self.store.hold()
            self.store.fail_writes = int(fail)
            tasks = [asyncio.ensure_future(self.call(c)) for c in calls]
            await asyncio.sleep(0.01)
            self.store.release()
            for answer in await asyncio.gather(*tasks):
                self.note(answer)

        self.run(together())

    # -- faults -----------------------------------------------------------------------------

    @rule(count=st.integers(1, 2))
    def writes_fail(self, count: int) -> None:
        self.store.fail_writes = count

    @rule()
    def disk_recovers(self) -> None:
        self.store.fail_writes = 0
        self.run(self.call(self.store.heartbeat(at=self.now[0])))

    @rule()
    def restart(self) -> None:
        self.store.fail_writes = 0
        before = {x.lease_id: (x.state, x.version) for x in self.node.leases.values()}
        self.run(self.store.aclose())
        self.node, self.store, self.events = self.run(self._open())
        after = {x.lease_id: (x.state, x.version) for x in self.node.leases.values()}
        expired = {i for i, (s, _v) in before.items() if i not in after}
        assert all(before[i][0] is LeaseState.RESERVED for i in expired), "only expiry"
        assert {i: v for i, v in after.items()} == {
            i: v for i, v in before.items() if i not in expired
        } | {i: v for i, v in after.items() if i in before and i not in expired}

    # -- the promises -----------------------------------------------------------------------

    @invariant()
    def devices_within_limits(self) -> None:
        for device in DEVICES:
            leases = self.node.ledger.on_device(device.uuid)
            tally = self.node.ledger.tally(device.uuid)
            assert tally == Tally.of(leases), "running tally equals the sum"
            assert self.node.ledger.domains(device.uuid) == {x.trust_domain for x in leases}
            used = tally.memory_bytes + tally.clients * RULES.context_overhead_bytes
            assert used <= device.memory_bytes
            assert tally.thread_pct <= RULES.thread_budget_pct + 1e-9
            assert tally.guaranteed_thread_pct <= RULES.guaranteed_budget_pct + 1e-9
            assert tally.clients <= RULES.max_clients

    @invariant()
    def ledger_equals_store_and_ended_stay_ended(self) -> None:
        stored = self.run(self.store.live_leases())
        live = {x.lease_id: (x.state, x.version) for x in self.node.leases.values()}
        assert live == {x.lease_id: (x.state, x.version) for x in stored}
        assert not self.ended & set(live), "an ended lease is live again"
        for lease_id in self.acked - set(live):
            lease = self.run(self.store.lease(lease_id))
            assert lease is not None and not lease.state.holds_capacity, "acknowledged, lost"
            self.ended.add(lease_id)

    @invariant()
    def events_replay_to_the_store(self) -> None:
        events = self.run(self.store.events_since(0, limit=10_000))
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), "dense numbers"
        last: dict[str, tuple[str, str]] = {}
        for event in events:
            if event.lease_id and event.kind.startswith("lease."):
                last[event.lease_id] = (event.kind, event.attrs["version"])
        for lease_id, (kind, version) in last.items():
            lease = self.run(self.store.lease(lease_id))
            assert lease is not None
            assert (kind, version) == (f"lease.{lease.state.value}", str(lease.version))
        published = self.events.since(0)
        assert published == events[-len(published) :] if published else True


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
