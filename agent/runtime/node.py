"""The node's lease ledger and the operations the scheduler calls.

Decisions are made one at a time under a lock, on the in-memory ledger, so each sees the
ones before it; the lease (and its events) is then written durably *outside* the lock, so
concurrent admissions share one sync (group commit). The answer goes back only after the
write. A failed write takes the lease back out and answers ``STORE_UNAVAILABLE``: the node
fails closed and never hands out a lease it could lose.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from agent.admission.attributes import admission_attributes, readiness_order
from agent.admission.capacity import StandardSize, Stranded, stranded
from agent.admission.policy import DeviceView, RetentionGate, Rules, decide
from agent.core.errors import ConflictError, NotFoundError, StateError
from agent.core.lease import Lease, LeaseState, transition
from agent.core.types import (
    AdmissionRequest,
    AdmissionStats,
    AdmitResult,
    BatchResult,
    Decision,
    Device,
    Event,
    MpsDaemonState,
    ReasonCode,
    SharingMode,
)
from agent.mps.limits import LEASE_MARKER_VAR, DaemonPaths, client_environment
from agent.runtime.events import EventLog
from agent.runtime.stats import AdmissionRecorder
from agent.runtime.transitions import LeaseTransitions
from agent.state.port import StateStore

log = logging.getLogger(__name__)
# P(ready) for rows of the nine admission-time attributes.
ReadinessPredictor = Callable[[Sequence[Mapping[str, float | str]]], Sequence[float]]


ENDED_KEPT = 100_000  # ended leases remembered in memory (older ones are read from the store)


class NodeService(LeaseTransitions):
    def __init__(
        self,
        devices: Sequence[Device],
        *,
        store: StateStore,
        events: EventLog,
        rules: Rules,
        sizes: Sequence[StandardSize],
        mps_root: str,
        mps_states: Callable[[], list[MpsDaemonState]],
        clock: Callable[[], float],
        reservation_ttl_s: float,
        ready_deadline_s: float = 600.0,
        gate: RetentionGate | None = None,
        readiness: ReadinessPredictor | None = None,
    ) -> None:
        self.gate = gate
        self.readiness = readiness
        self.devices = {d.uuid: d for d in devices}
        self._store = store
        self._events = events
        self.rules = rules
        self._sizes = list(sizes)
        self._mps_root = mps_root
        self._mps_states = mps_states
        self._clock = clock
        self._ttl_s = reservation_ttl_s
        self._ready_deadline_s = ready_deadline_s
        self._lock = asyncio.Lock()
        self.leases: dict[str, Lease] = {}
        self._by_request: dict[str, str] = {}
        self.drained: dict[str, str] = {}
        self._closures: dict[str, dict[str, tuple[ReasonCode, str]]] = {}
        self._ended: OrderedDict[str, Lease] = OrderedDict()
        self._expired_gangs: set[str] = set()
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._recorder = AdmissionRecorder()

    async def load(self) -> None:
        """Rebuild the ledger from the store; expire reservations whose TTL passed."""
        self._by_request.update(await self._store.request_index())
        for lease in await self._store.live_leases():
            self._remember(lease)
        self.drained = {u: r for u, r in (await self._store.drained()).items() if u in self.devices}
        expired = await self.expire_reservations()
        log.info(
            "ledger: %d live lease(s) restored, %d reservation(s) expired",
            len(self.leases),
            len(expired),
        )

    def _remember(self, lease: Lease) -> None:
        if lease.state.holds_capacity:
            self.leases[lease.lease_id] = lease
            self._ended.pop(lease.lease_id, None)
        else:
            self.leases.pop(lease.lease_id, None)
            self._ended[lease.lease_id] = lease
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
        self._by_request[lease.request_id] = lease.lease_id

    # -- views -----------------------------------------------------------------------------

    def views(self) -> list[DeviceView]:
        by_device: dict[str, list[Lease]] = {uuid: [] for uuid in self.devices}
        for lease in self.leases.values():
            by_device.setdefault(lease.device_uuid, []).append(lease)
        mps = {m.device_uuid: m for m in self._mps_states()}
        views = []
        for uuid, device in self.devices.items():
            closed, detail = self._closed(device, mps.get(uuid))
            views.append(DeviceView(device, tuple(by_device[uuid]), closed, detail))
        return views

    def _closed(
        self, device: Device, daemon: MpsDaemonState | None
    ) -> tuple[ReasonCode | None, str]:
        if not self._store.writable():
            return ReasonCode.STORE_UNAVAILABLE, "the state store cannot write: failing closed"
        if device.uuid in self.drained:
            return ReasonCode.DRAINING, f"drained: {self.drained[device.uuid]}"
        for reason, detail in self._closures.get(device.uuid, {}).values():
            return reason, detail
        if device.sharing_mode is SharingMode.MPS and (daemon is None or not daemon.up):
            why = daemon.detail if daemon is not None else "no daemon"
            return ReasonCode.DEVICE_UNAVAILABLE, f"MPS control daemon is down ({why})"
        return None, ""

    def close(self, device_uuid: str, source: str, reason: ReasonCode, detail: str) -> None:
        """Close a device to new leases on behalf of a control loop (``source``)."""
        self._closures.setdefault(device_uuid, {})[source] = (reason, detail)

    def reopen(self, device_uuid: str, source: str) -> None:
        self._closures.get(device_uuid, {}).pop(source, None)

    def stranded(self) -> Stranded:
        return stranded(self.views(), self.rules, self._sizes)

    # -- admission -------------------------------------------------------------------------

    async def explain(self, request: AdmissionRequest) -> AdmitResult:
        return AdmitResult(
            decide(request, self.views(), self.rules, now=self._clock(), gate=self.gate)
        )

    async def admit(
        self, request: AdmissionRequest, *, gang_id: str | None = None, ttl_s: float | None = None
    ) -> AdmitResult:
        started = time.perf_counter()
        result = await self._admit(request, gang_id=gang_id, ttl_s=ttl_s)
        self._recorder.record(result.decision, time.perf_counter() - started)
        return result

    def admission_stats(self) -> AdmissionStats:
        return self._recorder.snapshot()

    async def _admit(
        self, request: AdmissionRequest, *, gang_id: str | None, ttl_s: float | None
    ) -> AdmitResult:
        known = await self._known(request.request_id)
        if known is not None:
            return known
        async with self._lock:
            known = await self._known(request.request_id)
            if known is not None:
                return known
            now = self._clock()
            decision = decide(request, self.views(), self.rules, now=now, gate=self.gate)
            if not decision.admitted:
                return AdmitResult(decision)
            lease = self._new_lease(request, decision, now, gang_id, ttl_s)
            changes = [lease, *self._preempt(decision, now)]
            before = {c.lease_id: self.leases.get(c.lease_id) for c in changes}
            for change in changes:
                self._remember(change)
            write = self._write(request.request_id, changes, before, decision)
            if decision.preempted_lease_ids:
                # Victims' capacity must not be reused until the eviction is durable, or an
                # undo could overcommit: a preempting admission writes under the lock.
                return await self._settle(write, request, decision, lease)
        return await self._settle(write, request, decision, lease)

    def _write(
        self,
        request_id: str,
        changes: list[Lease],
        before: dict[str, Lease | None],
        decision: Decision,
    ) -> asyncio.Future[None]:
        events = [self._lease_event(c, decision) for c in changes]
        write = asyncio.ensure_future(self._store.commit(changes, events))
        self._inflight[request_id] = write

        def settled(done: asyncio.Future[None]) -> None:
            self._inflight.pop(request_id, None)
            if done.cancelled() or done.exception() is not None:
                self._undo(changes, before)

        write.add_done_callback(settled)
        return write

    async def _settle(
        self,
        write: asyncio.Future[None],
        request: AdmissionRequest,
        decision: Decision,
        lease: Lease,
    ) -> AdmitResult:
        """Answer once the write is durable. A cancelled caller leaves the write running:
        it completes (or is undone) on its own, and a retry with the same id waits for it."""
        try:
            await asyncio.shield(write)
        except StateError as exc:
            log.error("admission of %s not recorded: %s", request.request_id, exc)
            return AdmitResult(
                Decision(False, reason=ReasonCode.STORE_UNAVAILABLE, message=f"not admitted: {exc}")
            )
        return self._result(decision, lease)

    async def _known(self, request_id: str) -> AdmitResult | None:
        """Idempotency: a request id seen before gets the same live lease back, once it is
        durable; the id of a lease that has ended is refused, not reused."""
        inflight = self._inflight.get(request_id)
        if inflight is not None:
            try:
                await asyncio.shield(inflight)
            except StateError:
                return None  # the first attempt was not recorded: decide afresh
        lease_id = self._by_request.get(request_id)
        if lease_id is None:
            return None
        lease = self.leases.get(lease_id) or self._ended.get(lease_id)
        if lease is None:
            lease = await self._store.lease_by_request(request_id)
        if lease is None:
            return None
        if not lease.state.holds_capacity:
            raise ConflictError(
                f"request id {request_id!r} belongs to lease {lease.lease_id}, which is "
                f"{lease.state.value}; use a new request id"
            )
        decision = Decision(True, lease.device_uuid, message="already admitted (same request id)")
        return self._result(decision, lease)

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
        return Lease(
            lease_id="l-" + secrets.token_urlsafe(12),
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
            ready_deadline_at=now + self._ready_deadline_s,
            expires_at=now + (ttl_s or self._ttl_s) if reserved else None,
            gang_id=gang_id,
            counters=dict(request.counters),
            attributes=admission_attributes(
                request, self.devices[decision.device_uuid], concurrent_requests=len(self.leases)
            ),
        )

    def _preempt(self, decision: Decision, now: float) -> list[Lease]:
        return [
            transition(
                self.leases[i],
                LeaseState.EVICTED,
                at=now,
                reason="preempted by a guaranteed request",
            )
            for i in decision.preempted_lease_ids
        ]

    def _undo(self, changes: list[Lease], before: dict[str, Lease | None]) -> None:
        for change in changes:
            previous = before[change.lease_id]
            if previous is None:
                self.leases.pop(change.lease_id, None)
                self._by_request.pop(change.request_id, None)
            else:
                self._remember(previous)

    def _lease_event(self, lease: Lease, decision: Decision | None = None) -> Event:
        message = f"lease {lease.lease_id} {lease.state.value} on {lease.device_uuid}"
        if lease.reason:
            message += f": {lease.reason}"
        elif decision is not None and decision.message:
            message += f" ({decision.message})"
        return self._events.make(
            f"lease.{lease.state.value}",
            message,
            device_uuid=lease.device_uuid,
            lease_id=lease.lease_id,
            attrs={
                "tenant": lease.tenant,
                "request_id": lease.request_id,
                "memory_bytes": str(lease.memory_bytes),
                "thread_pct": f"{lease.thread_pct:g}",
            },
        )

    def _result(self, decision: Decision, lease: Lease) -> AdmitResult:
        device = self.devices[lease.device_uuid]
        if device.sharing_mode is SharingMode.EXCLUSIVE:
            env = {"CUDA_VISIBLE_DEVICES": device.uuid, LEASE_MARKER_VAR: lease.lease_id}
            return AdmitResult(decision, lease, env)
        paths = DaemonPaths(self._mps_root, device.uuid)
        env = client_environment(
            device,
            paths,
            thread_pct=lease.thread_pct,
            memory_bytes=lease.memory_bytes,
            lease_id=lease.lease_id,
        )
        return AdmitResult(decision, lease, env, ((paths.pipe_dir, paths.pipe_dir),))

    async def admit_batch(self, requests: Sequence[AdmissionRequest]) -> BatchResult:
        """Order by predicted readiness (arrival breaks ties; arrival alone without a
        predictor), then place in that order; every lease is durable before the batch
        answers."""
        probabilities: list[float] = []
        order = list(range(len(requests)))
        if self.readiness is not None and requests:
            device = next(iter(self.devices.values()))  # placement is not known yet
            rows = [
                admission_attributes(r, device, concurrent_requests=len(self.leases))
                for r in requests
            ]
            probabilities = [round(float(p), 6) for p in self.readiness(rows)]
            order = readiness_order(probabilities)
        tasks: dict[int, asyncio.Future[AdmitResult]] = {}
        for at in order:
            tasks[at] = asyncio.ensure_future(self.admit(requests[at]))
            await asyncio.sleep(0)  # let the decision happen in order, the writes together
        await asyncio.gather(*tasks.values())
        return BatchResult(
            tuple(tasks[at].result() for at in range(len(requests))),
            tuple(requests[at].request_id for at in order),
            tuple(probabilities),
            "predicted readiness" if probabilities else "arrival",
        )

    # -- operators -------------------------------------------------------------------------

    async def drain(self, device_uuid: str | None, reason: str) -> list[str]:
        targets = self._targets(device_uuid)
        for uuid in targets:
            await self._store.set_drained(uuid, reason or "drained", at=self._clock())
            self.drained[uuid] = reason or "drained"
            self._events(
                "device.drained", f"closed to new leases: {reason or 'drained'}", device_uuid=uuid
            )
        return targets

    async def undrain(self, device_uuid: str | None) -> list[str]:
        targets = [u for u in self._targets(device_uuid) if u in self.drained]
        for uuid in targets:
            await self._store.set_drained(uuid, None, at=self._clock())
            self.drained.pop(uuid, None)
            self._events("device.undrained", "open to new leases again", device_uuid=uuid)
        return targets

    def _targets(self, device_uuid: str | None) -> list[str]:
        if not device_uuid:
            return list(self.devices)
        if device_uuid not in self.devices:
            raise NotFoundError(f"no device {device_uuid!r} on this node")
        return [device_uuid]
