"""The node's lease service: the ledger, and the operations the scheduler and the control
loops call on it, wired from parts with one job each.

- :mod:`agent.node.ledger`: the live leases and per-device tallies (compare-and-set);
- :mod:`agent.node.admitting`: decide, write, answer (Admit, AdmitBatch, Explain);
- :mod:`agent.node.transitions`: release, commit, abort, expiry, readiness, endings;
- :mod:`agent.node.availability`: which devices take new leases, and why not;
- :mod:`agent.node.journal`: how a change becomes durable, then true, then told;
- this module: the read model (device views, stranded capacity) and start-up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence

from agent.admission.capacity import StandardSize, Stranded, stranded
from agent.admission.policy import DeviceView, RetentionGate, Rules
from agent.aio.section import LedgerLock
from agent.core.errors import StateError
from agent.core.lease import Lease, LeaseState
from agent.core.mpsstate import MpsDaemonState
from agent.core.snapshot import AdmissionStats, DeviceLedger, GoneDevice
from agent.core.types import (
    AdmissionRequest,
    AdmitResult,
    BatchResult,
    Decision,
    Device,
    Event,
    ReasonCode,
)
from agent.node.admitting import AdmissionOptions, Admissions, ReadinessPredictor
from agent.node.availability import Availability
from agent.node.events import EventLog
from agent.node.journal import Journal
from agent.node.ledger import REQUESTS_KEPT, Ledger, lost_in_this_round
from agent.node.refusals import RefusalNotes
from agent.node.transitions import Notes, Transitions
from agent.state.port import Retention, StateStore

log = logging.getLogger(__name__)
__all__ = ["NodeService", "ReadinessPredictor"]


class NodeService:
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
        retention: Retention | None = None,
    ) -> None:
        self.devices: Mapping[str, Device] = {d.uuid: d for d in devices}
        self.rules = rules
        self.gate = gate
        self.retention = retention or Retention()
        self._store = store
        self._events = events
        self.refusals = RefusalNotes(events, clock=clock)
        self._sizes = list(sizes)
        self._mps_states = mps_states
        self._clock = clock
        self.ledger = Ledger(self.devices)
        self._gone: dict[str, GoneDevice] = {}
        events.owner_of = self.owner_of
        lock = LedgerLock()
        journal = Journal(self.ledger, store, events)
        self.availability = Availability(self.devices, store=store, events=events, clock=clock)
        options = AdmissionOptions(
            rules, mps_root, reservation_ttl_s, ready_deadline_s, gate, readiness
        )
        self.admissions = Admissions(
            self.devices,
            ledger=self.ledger,
            journal=journal,
            store=store,
            lock=lock,
            views=self.views,
            clock=clock,
            options=options,
        )
        self.transitions = Transitions(
            ledger=self.ledger, journal=journal, store=store, lock=lock, clock=clock
        )
        # told of each lease an Admit answers with, and when that Admit began (the kubelet
        # device plugin starts the hold of a pod lease granted again to its binder)
        self.on_granted: Callable[[Lease, float], Awaitable[None]] = _no_grant_hook

    async def load(self) -> None:
        """Rebuild the ledger from the store; expire reservations whose TTL passed."""
        recent = await self._store.recent_requests(limit=REQUESTS_KEPT + 1)
        records = {(r.tenant, r.request_id): r for r in recent}
        live = await self._store.live_leases()
        for lease in live:
            key = (lease.tenant, lease.request_id)
            record = records.pop(key, None) or await self._store.request_record(*key)
            self.ledger.restore(lease, record)
        for record in records.values():
            self.ledger.remember_request(record)
        # Ids of ended leases beyond what memory holds are asked of the store.
        self.ledger.requests_complete = len(recent) <= REQUESTS_KEPT
        await self._restore_gang_rounds()
        await self.availability.load()
        await self.fail_leases_of_gone_devices()
        expired = await self.expire_reservations()
        log.info(
            "ledger: %d live lease(s) restored, %d reservation(s) expired", len(live), len(expired)
        )

    async def _restore_gang_rounds(self) -> None:
        """A gang whose round of reservations lost a member before the restart stays
        uncommittable until the round is over."""
        reserved: dict[str, list[Lease]] = {}
        for lease in self.ledger.live.values():
            if lease.gang_id and lease.state is LeaseState.RESERVED:
                reserved.setdefault(lease.gang_id, []).append(lease)
        for gang_id, members in sorted(reserved.items()):
            stored = await self._store.gang_leases(gang_id)
            lost = lost_in_this_round(gang_id, stored, members)
            if lost is not None:
                self.ledger.restore_broken(gang_id, lost)

    async def fail_leases_of_gone_devices(self, gone_uuids: Collection[str] = ()) -> list[Lease]:
        """Leases on a device this node no longer has (a GPU gone, MIG repartitioned; at
        start, or ``gone_uuids`` found at run time) are failed, each with a
        ``lease.device_gone`` event written in the same commit, just before its
        ``lease.failed``: a failed write tells of neither, instead of haunting no ledger."""
        gone = [
            x
            for x in self.ledger.live.values()
            if x.device_uuid not in self.devices or x.device_uuid in gone_uuids
        ]
        self._note_gone([], gone_uuids)
        if not gone:
            return []
        failed = await self.end_leases(
            [x.lease_id for x in gone],
            LeaseState.FAILED,
            "its device is gone",
            notes=self._device_gone_notes,
        )
        self._note_gone([x.device_uuid for x in failed], ())
        return failed

    def _device_gone_notes(self, failing: list[Lease]) -> list[Event]:
        notes = []
        for lease in failing:
            log.warning(
                "lease %s is on device %s, which is gone", lease.lease_id, lease.device_uuid
            )
            notes.append(
                self._events.draft(
                    "lease.device_gone",
                    f"lease {lease.lease_id} was on device {lease.device_uuid}, which this "
                    "node no longer has: failed",
                    device_uuid=lease.device_uuid,
                    lease_id=lease.lease_id,
                )
            )
        return notes

    def _note_gone(self, lease_devices: list[str], gone_uuids: Collection[str]) -> None:
        """Remember each gone device and the leases failed on it, for ``gpushare status``."""
        now = self._clock()
        for uuid in {*lease_devices, *gone_uuids}:
            known = self._gone.get(uuid)
            when = "at run time" if uuid in gone_uuids else "at start"
            self._gone[uuid] = GoneDevice(
                uuid,
                known.since if known else now,
                (known.leases_failed if known else 0) + lease_devices.count(uuid),
                known.when if known else when,
            )

    def gone_devices(self) -> tuple[GoneDevice, ...]:
        return tuple(self._gone.values())

    # -- the read model --------------------------------------------------------------------

    @property
    def leases(self) -> Mapping[str, Lease]:
        return self.ledger.live

    def views(self) -> list[DeviceView]:
        mps = {m.device_uuid: m for m in self._mps_states()}
        pinned = self.ledger.pinned()
        views = []
        for uuid, device in self.devices.items():
            closed, detail = self.availability.closed(device, mps.get(uuid))
            views.append(
                DeviceView(
                    device,
                    self.ledger.on_device(uuid),
                    closed,
                    detail,
                    tally=self.ledger.tally(uuid),
                    pinned=pinned,
                    domains=self.ledger.domains(uuid),
                    users=self.ledger.users(uuid),
                )
            )
        return views

    def device_ledgers(self) -> tuple[DeviceLedger, ...]:
        return tuple(
            DeviceLedger(
                v.device.uuid,
                v.memory_committed_bytes,
                v.threads_committed_pct,
                len(v.leases),
                v.closed.value if v.closed else "",
                v.closed_detail,
            )
            for v in self.views()
        )

    def stranded(self) -> Stranded:
        return stranded(self.views(), self.rules, self._sizes)

    def admission_stats(self) -> AdmissionStats:
        return self.admissions.recorder.snapshot()

    # -- admission -------------------------------------------------------------------------

    async def explain(self, request: AdmissionRequest) -> AdmitResult:
        return await self.admissions.explain(request)

    async def admit(
        self, request: AdmissionRequest, *, gang_id: str | None = None, ttl_s: float | None = None
    ) -> AdmitResult:
        asked_at = self._clock()
        result = await self.admissions.admit(request, gang_id=gang_id, ttl_s=ttl_s)
        if result.lease is not None and result.decision.admitted:
            await self.on_granted(result.lease, asked_at)
        elif not result.decision.admitted:
            self.refusals(request, result.decision)
        return result

    async def admit_batch(self, requests: Sequence[AdmissionRequest]) -> BatchResult:
        return await self.admissions.admit_batch(requests)

    # -- transitions -----------------------------------------------------------------------

    async def release(self, lease_id: str, *, owner: str | None = None) -> Lease:
        return await self.transitions.release(lease_id, owner=owner)

    async def commit(self, gang_id: str, *, owner: str | None = None) -> list[Lease]:
        return await self.transitions.commit(gang_id, owner=owner)

    async def abort(self, gang_id: str, *, owner: str | None = None) -> list[Lease]:
        return await self.transitions.abort(gang_id, owner=owner)

    def container_edits(self, lease: Lease) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
        """What a container given ``lease`` gets, whichever path hands it over (the device
        plugin, NRI, a DRA claim's CDI spec): its client environment with the device it may
        see, and its (host, container) mounts."""
        result = self.admissions.result(Decision(True, lease.device_uuid), lease)
        return {**result.env, "NVIDIA_VISIBLE_DEVICES": lease.device_uuid}, result.mounts

    def owner_of(self, lease_id: str) -> str:
        """The caller identity that made a lease the ledger knows, else ""."""
        lease = self.ledger.get(lease_id)
        return lease.owner if lease is not None else ""

    async def mark_ready(self, lease: Lease, client_pids: list[int]) -> Lease | None:
        return await self.transitions.mark_ready(lease, client_pids)

    async def mark_ineffective(self, lease: Lease) -> Lease | None:
        return await self.transitions.mark_ineffective(lease)

    async def end_leases(
        self,
        lease_ids: Sequence[str],
        target: LeaseState,
        reason: str,
        *,
        notes: Notes | None = None,
    ) -> list[Lease]:
        return await self.transitions.end_leases(lease_ids, target, reason, notes=notes)

    async def expire_reservations(self) -> list[Lease]:
        return await self.transitions.expire_reservations()

    async def clear_stale(self, *, dry_run: bool) -> list[str]:
        """What is stale and, unless ``dry_run``, clear it: today, reservations past TTL."""
        due = self.transitions.due()
        actions = [f"expire reservation {x.lease_id} of gang {x.gang_id}" for x in due]
        if not dry_run and due:
            await self.expire_reservations()
        return actions

    # -- devices ---------------------------------------------------------------------------

    def close(self, device_uuid: str, source: str, reason: ReasonCode, detail: str) -> None:
        self.availability.close(device_uuid, source, reason, detail)

    def reopen(self, device_uuid: str, source: str) -> None:
        self.availability.reopen(device_uuid, source)
        if source == "gone":
            self._gone.pop(device_uuid, None)

    @property
    def drained(self) -> Mapping[str, str]:
        return self.availability.drained

    async def drain(self, device_uuid: str | None, reason: str) -> list[str]:
        return await self.availability.drain(device_uuid, reason)

    async def undrain(self, device_uuid: str | None) -> list[str]:
        return await self.availability.undrain(device_uuid)

    # -- supervised tasks ------------------------------------------------------------------

    async def reservation_reaper(
        self, *, interval_s: float = 1.0, heartbeat_every: int = 10
    ) -> None:
        """Expire reservations as their TTL passes, and check that the store can write: every
        ``heartbeat_every`` rounds, and every round while it cannot (a supervised task)."""
        rounds = 0
        while True:
            await asyncio.sleep(interval_s)
            rounds += 1
            await self.transitions.reaper_round(heartbeat=rounds % heartbeat_every == 0)

    async def pruner(self, *, interval_s: float = 60.0) -> None:
        """Forget what the retention no longer keeps, in the store and in memory."""
        while True:
            await asyncio.sleep(interval_s)
            await self.prune_once()

    async def prune_once(self) -> None:
        now = self._clock()
        try:
            pruned = await self._store.prune(now=now, retention=self.retention)
        except StateError as exc:
            log.warning("pruning the state store failed: %s", exc)
            return
        self.ledger.forget_requests_before(now - self.retention.ended_s)
        if pruned.leases or pruned.events or pruned.requests:
            log.info("pruned %s", pruned)


async def _no_grant_hook(_lease: Lease, _asked_at: float) -> None:
    return None
