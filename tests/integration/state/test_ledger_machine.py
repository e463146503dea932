"""The ledger's promises explored: a hypothesis state machine drives admit, batches, gangs,
releases, readiness, expiry, preemption and races with held writes on the real store, with
write failures and restarts injected anywhere, callers cancelled at any point of admit,
admit-batch, preempting admit, commit, abort and release, and the reservation reaper
racing commits. It checks after every step that

- no device is committed past its memory, thread or client limits, and the ledger's
  running tallies (and its trust domains and known UIDs) equal those of its leases; no
  device holds leases of two known UIDs (one MPS server per UID); during the racing steps
  a probe task samples the ledger (every loop turn) and the store (as often as it can
  read) while the writes are held, so not even a moment past the limits goes unseen;
- no gang is committed in part: a commit admits every member reserved at that moment,
  and never one of a round of reservations that lost a member;
- the ledger equals the store (the same live leases, states, versions and UIDs), so a
  restart restores exactly what was acknowledged;
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
from agent.core.lease import Lease, LeaseState
from agent.core.types import Device, Event, PriorityClass
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
uids = st.sampled_from([None, 1000, 2000])  # None: a caller that does not say
threads = st.sampled_from([10.0, 25.0, 40.0])
gangs = st.sampled_from(["g1", "g2", "g3"])
picks = st.integers(0, 10_000)
# where a cancelled caller is cut: after this many turns of the event loop
cut_after = st.integers(0, 40)
CALLS = ("admit", "batch", "preempting", "reserve", "commit", "abort", "release")


def over_limits(device: Device, leases: Any) -> str:
    """Why ``leases`` on ``device`` are past its limits, or ""."""
    tally = Tally.of(list(leases))
    used = tally.memory_bytes + tally.clients * RULES.context_overhead_bytes
    if used > device.memory_bytes:
        return f"{device.uuid}: {used} bytes committed of {device.memory_bytes}"
    if tally.thread_pct > RULES.thread_budget_pct + 1e-9:
        return f"{device.uuid}: {tally.thread_pct}% of threads"
    if tally.guaranteed_thread_pct > RULES.guaranteed_budget_pct + 1e-9:
        return f"{device.uuid}: {tally.guaranteed_thread_pct}% guaranteed threads"
    if tally.clients > RULES.max_clients:
        return f"{device.uuid}: {tally.clients} clients"
    return ""


def by_device(leases: Any) -> dict[str, list[Lease]]:
    grouped: dict[str, list[Lease]] = {d.uuid: [] for d in DEVICES}
    for lease in leases:
        grouped.setdefault(lease.device_uuid, []).append(lease)
    return grouped


def partly_committed(events: list[Event], gang_of: dict[str, str | None]) -> str:
    """Replay the stream: a commit must admit every member reserved at that moment, and
    none of a round that lost a reserved member otherwise than by the gang's abort (a round
    lasts while the gang holds reserved members). "" when no gang was committed in part."""
    reserved: dict[str, set[str]] = {}
    lost: dict[str, bool] = {}
    at = 0
    while at < len(events):
        event = events[at]
        gang = gang_of.get(event.lease_id or "")
        at += 1
        if not gang or not event.kind.startswith("lease."):
            continue
        members = reserved.setdefault(gang, set())
        state = event.kind.removeprefix("lease.")
        if state == "reserved":
            members.add(event.lease_id or "")
        elif state == "admitted" and event.lease_id in members:
            committed = {event.lease_id}
            while at < len(events) and events[at].kind == "lease.admitted":
                if gang_of.get(events[at].lease_id or "") != gang:
                    break
                committed.add(events[at].lease_id)
                at += 1
            if lost.get(gang):
                return f"gang {gang} committed after it lost a reserved member"
            if committed != members:
                return f"gang {gang}: {sorted(committed)} committed of {sorted(members)}"
            members.clear()
        elif state in ("expired", "released") and event.lease_id in members:
            members.discard(event.lease_id)
            if not event.message.endswith(f"gang {gang} aborted"):
                lost[gang] = True
        if not members:
            lost[gang] = False  # the round is over
    return ""


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-machine-"))
        self.now = [1000.0]
        self.ended: set[str] = set()
        self.acked: set[str] = set()
        self.seen_over: list[str] = []  # what the probe saw past the limits
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

    @rule(rid=request_ids, tenant=tenants, gib=sizes, priority=priorities, pct=threads, uid=uids)
    def admit(
        self, rid: str, tenant: str, gib: int, priority: PriorityClass, pct: float, uid: int | None
    ) -> None:
        ask = request(rid, gib, priority, tenant=tenant, thread_pct=pct, run_as_uid=uid)
        req = dataclasses.replace(ask, trust_domain=tenant)
        self.note(self.run(self.call(self.node.admit(req))))

    @rule(items=st.lists(st.tuples(request_ids, sizes, priorities, uids), min_size=1, max_size=4))
    def admit_batch(self, items: list[tuple[str, int, PriorityClass, int | None]]) -> None:
        unique = {rid: (gib, p, uid) for rid, gib, p, uid in items}
        batch = [
            request(rid, gib, p, tenant="a", run_as_uid=uid)
            for rid, (gib, p, uid) in unique.items()
        ]
        answer = self.run(self.call(self.node.admit_batch(batch)))
        for result in getattr(answer, "results", ()):
            self.note(result)

    @rule(rid=request_ids, gang=gangs, gib=sizes, ttl=st.sampled_from([1.0, 5.0]), uid=uids)
    def reserve(self, rid: str, gang: str, gib: int, ttl: float, uid: int | None) -> None:
        req = request(f"{gang}-{rid}", gib, tenant="a", run_as_uid=uid)
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

    # -- callers that go away, and the reaper racing commits --------------------------------

    def start(self, call: str, rid: str, gang: str, gib: int, at: int) -> Any:
        """The coroutine of one caller's call."""
        if call == "admit":
            return self.node.admit(request(rid, gib, tenant="a"))
        if call == "batch":
            return self.node.admit_batch(
                [request(rid, gib, tenant="a"), request(f"{rid}-b", 5, tenant="a")]
            )
        if call == "preempting":
            gib = self.preempting_gib()
            return self.node.admit(request(f"p-{rid}", gib, PriorityClass.GUARANTEED, tenant="b"))
        if call == "reserve":
            return self.node.admit(request(f"{gang}-{rid}", gib, tenant="a"), gang_id=gang)
        if call == "commit":
            return self.node.commit(gang)
        if call == "abort":
            return self.node.abort(gang)
        return self.node.release(self.pick(self.acked, at) or "l-none")

    def preempting_gib(self) -> float:
        """A size that fits only by preempting, where a best-effort lease can be a victim:
        one GiB more than the device holding the most best-effort memory has free."""
        best, room = 35.0, -1
        for device in DEVICES:
            leases = self.node.ledger.on_device(device.uuid)
            victims = sum(x.memory_bytes for x in leases if x.priority is PriorityClass.BEST_EFFORT)
            tally = Tally.of(list(leases))
            free = device.memory_bytes - tally.memory_bytes - (tally.clients + 1) * GIB
            if victims > room and victims > 0:
                best, room = (free + GIB) / GIB, victims
        return max(best, 1.0)

    async def started(self, call: str, rid: str, gang: str, gib: int, at: int) -> Any:
        """The call, made once its task runs (a task cancelled before it ran made none)."""
        return await self.call(self.start(call, rid, gang, gib, at))

    async def probe(self, stop: asyncio.Event) -> None:
        """Sample the ledger every loop turn and the store as often as it reads, while
        the step runs; what is past the limits is kept for the step to fail on."""
        reading: asyncio.Future[list[Lease]] | None = None
        while not stop.is_set():
            for device in DEVICES:
                if why := over_limits(device, self.node.ledger.on_device(device.uuid)):
                    self.seen_over.append(f"ledger: {why}")
            if reading is None or reading.done():
                if reading is not None and not reading.exception():
                    for uuid, leases in by_device(reading.result()).items():
                        device = next(d for d in DEVICES if d.uuid == uuid)
                        if why := over_limits(device, leases):
                            self.seen_over.append(f"store: {why}")
                reading = asyncio.ensure_future(self.store.live_leases())
            await asyncio.sleep(0)
        if reading is not None:
            await asyncio.gather(reading, return_exceptions=True)

    async def settled(self) -> None:
        """Until no write of the ledger is in flight and its lock is free."""
        while self.node.ledger.pinned() or self.node.transitions._lock.locked():
            await asyncio.sleep(0.005)

    @rule(
        call=st.sampled_from(CALLS),
        follow=st.sampled_from((*CALLS, "")),
        rid=request_ids,
        gang=gangs,
        gib=sizes,
        at=picks,
        cut=cut_after,
        hold=st.booleans(),
        fail=st.booleans(),
    )
    def caller_goes_away(
        self,
        call: str,
        follow: str,
        rid: str,
        gang: str,
        gib: int,
        at: int,
        cut: int,
        hold: bool,
        fail: bool,
    ) -> None:
        """The call is cancelled after ``cut`` turns of the loop, with its writes held (a
        slow disk) or not, failing or not; another call (``follow``) comes while they are
        still held. The ledger must come out whole, and be within limits throughout."""

        async def cut_short() -> None:
            stop = asyncio.Event()
            probe = asyncio.ensure_future(self.probe(stop))
            if hold:
                self.store.hold()
            self.store.fail_writes = int(fail)
            task = asyncio.ensure_future(self.started(call, rid, gang, gib, at))
            for _ in range(cut):
                await asyncio.sleep(0)
            task.cancel()
            followers = [self.started(follow, f"{rid}-f", gang, gib, at + 1)] if follow else []
            after = [asyncio.ensure_future(c) for c in followers]
            await asyncio.sleep(0.01)
            self.store.release()
            for answer in await asyncio.gather(task, *after, return_exceptions=True):
                self.note(answer)
                for result in getattr(answer, "results", ()):
                    self.note(result)
            await self.settled()
            self.store.fail_writes = 0
            stop.set()
            await probe

        self.run(cut_short())
        assert not self.seen_over, self.seen_over[:3]

    @rule(gang=gangs, seconds=st.sampled_from([0.5, 2.0]), reaper_first=st.booleans())
    def reaper_races_commit(self, gang: str, seconds: float, reaper_first: bool) -> None:
        """Time passes, then the reaper and a commit of the gang run together with the
        store held: one of them wins each member, and the gang is committed whole or not
        at all (checked by the invariant)."""

        async def race() -> None:
            self.now[0] += seconds
            self.store.hold()
            reaper = self.node.transitions.reaper_round(heartbeat=False)
            commit = self.call(self.node.commit(gang))
            calls = [reaper, commit] if reaper_first else [commit, reaper]
            tasks = [asyncio.ensure_future(c) for c in calls]
            await asyncio.sleep(0.01)
            self.store.release()
            await asyncio.gather(*tasks)

        self.run(race())

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
        uids = {x.lease_id: x.run_as_uid for x in self.node.leases.values()}
        self.run(self.store.aclose())
        self.node, self.store, self.events = self.run(self._open())
        after = {x.lease_id: (x.state, x.version) for x in self.node.leases.values()}
        assert {x.lease_id: x.run_as_uid for x in self.node.leases.values()} == {
            i: uid for i, uid in uids.items() if i in after
        }, "a lease's UID survives the restart"
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
            users = self.node.ledger.users(device.uuid)
            assert users == {x.run_as_uid for x in leases if x.run_as_uid is not None}
            assert len(users) <= 1, f"{device.uuid} serves UIDs {sorted(users)}"
            used = tally.memory_bytes + tally.clients * RULES.context_overhead_bytes
            assert used <= device.memory_bytes
            assert tally.thread_pct <= RULES.thread_budget_pct + 1e-9
            assert tally.guaranteed_thread_pct <= RULES.guaranteed_budget_pct + 1e-9
            assert tally.clients <= RULES.max_clients

    @invariant()
    def ledger_equals_store_and_ended_stay_ended(self) -> None:
        stored = self.run(self.store.live_leases())
        live = {x.lease_id: (x.state, x.version, x.run_as_uid) for x in self.node.leases.values()}
        assert live == {x.lease_id: (x.state, x.version, x.run_as_uid) for x in stored}
        assert not self.ended & set(live), "an ended lease is live again"
        for lease_id in self.acked - set(live):
            lease = self.run(self.store.lease(lease_id))
            assert lease is not None and not lease.state.holds_capacity, "acknowledged, lost"
            self.ended.add(lease_id)

    @invariant()
    def no_gang_committed_in_part(self) -> None:
        events = self.run(self.store.events_since(0, limit=10_000))
        gang_of: dict[str, str | None] = {}
        for lease_id in {e.lease_id for e in events if e.lease_id}:
            lease = self.run(self.store.lease(lease_id))
            gang_of[lease_id] = lease.gang_id if lease is not None else None
        assert not (why := partly_committed(events, gang_of)), why

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
