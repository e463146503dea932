"""Admission: decide under the ledger lock, write outside it, answer once durable.

Decisions are made one at a time on the ledger, so each sees the ones before it; a new
lease takes its capacity at decision time and its write (with its event and request id)
joins a group commit outside the lock. A failed write takes exactly that lease back out
and answers ``STORE_UNAVAILABLE``. A preempting admission changes other leases, so it
hands the lock to its write, which keeps it until it is durable and applies everything at
once; it never picks a victim whose own write is in flight. A batch is one decision: one
lock, placement in order, one commit, one outcome per item.

A caller that goes away (a deadline, a cancelled task) cannot cut a decision in half:
between taking the lock and starting the write nothing awaits, and from then on the write
runs on its own, holding the lock where it must (:mod:`agent.aio.section`); a retry
with the same request id waits for it and gets its lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from agent.admission.attributes import admission_attributes, readiness_order
from agent.admission.policy import DeviceView, RetentionGate, Rules, decide
from agent.aio.section import Held, LedgerLock
from agent.core.errors import ConflictError, GpushareError, PermissionDeniedError, StateError
from agent.core.lease import ENDED_REQUEST_ID_HINT, Lease, LeaseState, new_lease_id, transition
from agent.core.types import (
    AdmissionRequest,
    AdmitResult,
    BatchResult,
    Decision,
    Device,
    ReasonCode,
    SharingMode,
)
from agent.mps.limits import LEASE_MARKER_VAR, DaemonPaths, client_environment
from agent.node.journal import Journal, Write
from agent.node.ledger import Ledger, RequestKey
from agent.node.requests import check_same, record_for
from agent.node.stats import AdmissionRecorder
from agent.state.port import RequestRecord, StateStore

log = logging.getLogger(__name__)
# P(ready) for rows of the nine admission-time attributes.
ReadinessPredictor = Callable[[Sequence[Mapping[str, float | str]]], Sequence[float]]


@dataclasses.dataclass(frozen=True, slots=True)
class AdmissionOptions:
    rules: Rules
    mps_root: str
    reservation_ttl_s: float
    ready_deadline_s: float = 600.0
    gate: RetentionGate | None = None
    readiness: ReadinessPredictor | None = None


@dataclasses.dataclass(slots=True)
class _Taken:
    at: int  # position in the request list
    lease: Lease
    record: RequestRecord
    decision: Decision


class Admissions:
    def __init__(
        self,
        devices: Mapping[str, Device],
        *,
        ledger: Ledger,
        journal: Journal,
        store: StateStore,
        lock: LedgerLock,
        views: Callable[[], list[DeviceView]],
        clock: Callable[[], float],
        options: AdmissionOptions,
    ) -> None:
        self._devices = devices
        self._ledger = ledger
        self._journal = journal
        self._store = store
        self._lock = lock
        self._views = views
        self._clock = clock
        self.options = options
        self._inflight: dict[RequestKey, Write] = {}
        self.recorder = AdmissionRecorder()

    async def explain(self, request: AdmissionRequest) -> AdmitResult:
        o = self.options
        gate = o.gate.explaining() if o.gate is not None else None
        return AdmitResult(decide(request, self._views(), o.rules, now=self._clock(), gate=gate))

    async def admit(
        self, request: AdmissionRequest, *, gang_id: str | None = None, ttl_s: float | None = None
    ) -> AdmitResult:
        started = time.perf_counter()
        result = await self._admit(request, gang_id, ttl_s)
        self.recorder.record(result.decision, time.perf_counter() - started)
        return result

    async def _admit(
        self, request: AdmissionRequest, gang_id: str | None, ttl_s: float | None
    ) -> AdmitResult:
        key = (request.tenant, request.request_id)
        while True:
            known = await self.known(request, gang_id)
            if known is not None:
                return known
            async with self._lock.held() as held:
                if self._seen(key):
                    continue  # a twin got there first: answer as it did
                decided = self._decide(request, gang_id, ttl_s, held)
                if isinstance(decided, AdmitResult):
                    return decided
                write, taken = decided
                self._track(key, write)
            return (await self._settle(write, [taken]))[0]

    def _decide(
        self, request: AdmissionRequest, gang_id: str | None, ttl_s: float | None, held: Held
    ) -> AdmitResult | tuple[Write, _Taken]:
        """Under the lock, with no await: the decision, and the write that carries it."""
        if gang_id is not None:
            self._check_gang_owner(gang_id, request.owner)
        now = self._clock()
        o = self.options
        decision = decide(request, self._views(), o.rules, now=now, gate=o.gate)
        if not decision.admitted:
            return AdmitResult(decision)
        decision = _lean(decision)
        lease = self._new_lease(request, decision, now, gang_id, ttl_s)
        record = record_for(request, gang_id, lease.lease_id, now)
        taken = _Taken(0, lease, record, decision)
        if decision.preempted_lease_ids:
            write = self._preempting(lease, record, decision, now)
            held.hand_to(write)  # alone on the ledger until the victims' end is durable
            return write, taken
        self._ledger.take(lease, record)
        write = self._journal.write(
            [lease],
            requests=[record],
            apply=False,
            undo=self._undo([(lease, record)]),
            decision=decision,
        )
        return write, taken

    def _preempting(
        self, lease: Lease, record: RequestRecord, decision: Decision, now: float
    ) -> Write:
        """The write of a preempting admission: the victims' capacity is reused only once
        their eviction is on disk, and a failed write has changed nothing at all."""
        victims = [
            transition(
                self._ledger.live[i],
                LeaseState.EVICTED,
                at=now,
                reason="preempted by a guaranteed request",
            )
            for i in decision.preempted_lease_ids
        ]
        return self._journal.write([lease, *victims], requests=[record], decision=decision)

    def _undo(self, taken: list[tuple[Lease, RequestRecord]]) -> Callable[[], None]:
        """Give back exactly what a failed write had taken."""

        def undo() -> None:
            for lease, record in taken:
                self._ledger.untake(lease, record)

        return undo

    def _seen(self, key: RequestKey) -> bool:
        """Under the lock: is this id being written, or does it name a lease?"""
        record = self._ledger.request(key)
        return key in self._inflight or (
            record is not None and self._ledger.get(record.lease_id) is not None
        )

    def _track(self, key: RequestKey, write: Write) -> None:
        self._inflight[key] = write
        write.add_done_callback(lambda _done: self._inflight.pop(key, None))

    async def _settle(self, write: Write, taken: Sequence[_Taken]) -> list[AdmitResult]:
        """Answer once the write is durable. A cancelled caller leaves the write running:
        it completes (or is undone) on its own, and a retry with the same id waits for it."""
        try:
            await asyncio.shield(write)
        except StateError as exc:
            log.error("admission of %d lease(s) not recorded: %s", len(taken), exc)
            refusal = Decision(
                False, reason=ReasonCode.STORE_UNAVAILABLE, message=f"not admitted: {exc}"
            )
            return [AdmitResult(refusal) for _ in taken]
        return [self.result(t.decision, t.lease) for t in taken]

    def _check_gang_owner(self, gang_id: str, owner: str) -> None:
        """A gang is joined only by the caller that reserved its first member."""
        if owner and any(x.owner and x.owner != owner for x in self._ledger.gang(gang_id)):
            raise PermissionDeniedError(f"gang {gang_id!r} was reserved by another caller")

    async def known(self, request: AdmissionRequest, gang_id: str | None) -> AdmitResult | None:
        """Idempotency: a request id seen before gets the same live lease back, once it is
        durable; the id of a lease that has ended is refused, not reused; the same id with
        another request is ALREADY_EXISTS."""
        key = (request.tenant, request.request_id)
        inflight = self._inflight.get(key)
        if inflight is not None:
            try:
                await asyncio.shield(inflight)
            except StateError:
                return None  # the first attempt was not recorded: decide afresh
        record = self._ledger.request(key)
        if record is None and not self._ledger.requests_complete:
            record = await self._store.request_record(*key)
        if record is None:
            return None
        check_same(record, request, gang_id)
        lease = self._ledger.get(record.lease_id) or await self._store.lease(record.lease_id)
        if lease is None:
            return None
        if not lease.state.holds_capacity:
            raise ConflictError(
                f"request id {request.request_id!r} belongs to lease {lease.lease_id}, which "
                f"is {lease.state.value}; {ENDED_REQUEST_ID_HINT}"
            )
        decision = Decision(True, lease.device_uuid, message="already admitted (same request id)")
        return self.result(decision, lease)

    def _new_lease(
        self,
        request: AdmissionRequest,
        decision: Decision,
        now: float,
        gang_id: str | None,
        ttl_s: float | None,
    ) -> Lease:
        assert decision.device_uuid is not None
        reserved = gang_id is not None
        o = self.options
        return Lease(
            lease_id=new_lease_id(),
            request_id=request.request_id,
            tenant=request.tenant,
            trust_domain=request.trust_domain,
            device_uuid=decision.device_uuid,
            priority=request.priority,
            memory_bytes=request.memory_bytes,
            thread_pct=request.thread_pct,
            state=LeaseState.RESERVED if reserved else LeaseState.ADMITTED,
            created_at=now,
            updated_at=now,
            profile=request.profile,
            retention_floor=request.retention_floor,
            ready_deadline_at=now + o.ready_deadline_s,
            expires_at=now + (ttl_s or o.reservation_ttl_s) if reserved else None,
            gang_id=gang_id,
            owner=request.owner,
            workload=request.workload,
            pod=request.pod,
            run_as_uid=request.run_as_uid,
            counters=dict(request.counters),
            attributes=admission_attributes(
                request,
                self._devices[decision.device_uuid],
                concurrent_requests=len(self._ledger.live),
            ),
        )

    def result(self, decision: Decision, lease: Lease) -> AdmitResult:
        device = self._devices[lease.device_uuid]
        if device.sharing_mode is SharingMode.EXCLUSIVE:
            env = {"CUDA_VISIBLE_DEVICES": device.uuid, LEASE_MARKER_VAR: lease.lease_id}
            return AdmitResult(decision, lease, env)
        paths = DaemonPaths(self.options.mps_root, device.uuid)
        env = client_environment(
            device,
            paths,
            thread_pct=lease.thread_pct,
            memory_bytes=lease.memory_bytes,
            lease_id=lease.lease_id,
        )
        return AdmitResult(decision, lease, env, ((paths.pipe_dir, paths.pipe_dir),))

    # -- batches ---------------------------------------------------------------------------

    async def admit_batch(self, requests: Sequence[AdmissionRequest]) -> BatchResult:
        """Order by predicted readiness (arrival breaks ties; arrival alone without a
        predictor), then place in that order under one lock, in one commit. Each item has
        its own outcome; a batch never preempts."""
        started = time.perf_counter()
        probabilities = self._probabilities(requests)
        order = readiness_order(probabilities) if probabilities else list(range(len(requests)))
        results: dict[int, AdmitResult] = {}
        for at, request in enumerate(requests):
            try:
                known = await self.known(request, None)
            except GpushareError as exc:
                known = _item_error(exc)
            if known is not None:
                results[at] = known
        taken, write = await self._place_batch(requests, order, results)
        if write is not None:
            for item, result in zip(taken, await self._settle(write, taken), strict=True):
                results[item.at] = result
        took_s = (time.perf_counter() - started) / max(1, len(requests))
        for result in results.values():
            self.recorder.record(result.decision, took_s)
        return BatchResult(
            tuple(results[at] for at in range(len(requests))),
            tuple(requests[at].request_id for at in order),
            tuple(probabilities),
            "predicted readiness" if probabilities else "arrival",
        )

    def _probabilities(self, requests: Sequence[AdmissionRequest]) -> list[float]:
        predictor = self.options.readiness
        if predictor is None or not requests:
            return []
        device = next(iter(self._devices.values()))  # placement is not known yet
        live = len(self._ledger.live)
        rows = [admission_attributes(r, device, concurrent_requests=live) for r in requests]
        return [round(float(p), 6) for p in predictor(rows)]

    async def _place_batch(
        self,
        requests: Sequence[AdmissionRequest],
        order: Sequence[int],
        results: dict[int, AdmitResult],
    ) -> tuple[list[_Taken], Write | None]:
        taken: list[_Taken] = []
        async with self._lock.held():
            now = self._clock()
            o = self.options
            for at in order:
                if at in results:
                    continue
                request = requests[at]
                key = (request.tenant, request.request_id)
                if self._seen(key):
                    results[at] = _item_error(
                        ConflictError(f"request id {request.request_id!r} is being admitted")
                    )
                    continue
                decision = decide(
                    request, self._views(), o.rules, now=now, gate=o.gate, allow_preemption=False
                )
                if not decision.admitted:
                    results[at] = AdmitResult(decision)
                    continue
                lease = self._new_lease(request, decision, now, None, None)
                record = record_for(request, None, lease.lease_id, now)
                self._ledger.take(lease, record)
                taken.append(_Taken(at, lease, record, decision))
            if not taken:
                return taken, None

            write = self._journal.write(
                [t.lease for t in taken],
                requests=[t.record for t in taken],
                apply=False,
                undo=self._undo([(t.lease, t.record) for t in taken]),
            )
            for item in taken:
                self._track((item.lease.tenant, item.lease.request_id), write)
        return taken, write


def _lean(decision: Decision) -> Decision:
    """An admission's answer names the chosen device's attempt only (Explain has all)."""
    chosen = tuple(a for a in decision.attempts if a.device_uuid == decision.device_uuid)
    return dataclasses.replace(decision, attempts=chosen)


def _item_error(exc: GpushareError) -> AdmitResult:
    decision = Decision(False, reason=ReasonCode.REQUEST_ID_CONFLICT, message=str(exc))
    return AdmitResult(decision, error=exc)
