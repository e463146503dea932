"""The node's run records: progress reports (``ReportProgress``) and the leases on each
device, followed by a :class:`ProgressTracker`, become run records in the state store.

The tracker hears of a device's leases from the published lease events (after the write
that makes them true, so the ledger it reads is the new one), of its counters from the
sampler's closed windows, and of progress from the API. The records it makes are written
by the ``run-records-writer`` task (kept, bounded, while the store cannot write).
Progress itself stays in memory: a restart loses only the windows open at the time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from agent.core.errors import NotFoundError, PermissionDeniedError
from agent.core.learning import ProgressAnswer
from agent.core.lease import LeaseState
from agent.core.samples import WindowSample
from agent.core.types import Device, Event
from agent.estimator.records import to_json
from agent.learning.progress import NodeRecord, ProgressTracker
from agent.node.ledger import Ledger
from agent.state.port import RunRecordRow, StateStore

log = logging.getLogger(__name__)
MAX_UNWRITTEN = 10_000  # records kept while the store cannot write
RETRY_S = 1.0
ENDED_KINDS = frozenset(f"lease.{s.value}" for s in LeaseState if not s.holds_capacity)


class RunRecorder:
    def __init__(
        self,
        tracker: ProgressTracker,
        *,
        store: StateStore,
        devices: Sequence[Device],
        ledger: Ledger,
        clock: Callable[[], float],
    ) -> None:
        self.tracker = tracker
        self._store = store
        self._devices = {d.uuid: d for d in devices}
        self._ledger = ledger
        self._clock = clock  # wall time: when a record was made, telemetry windows
        self._unwritten: list[RunRecordRow] = []
        self._wake = asyncio.Event()
        self._writing = asyncio.Lock()
        # a write whose caller was cancelled (a stop) while it ran: its batch and outcome
        self._in_flight: tuple[asyncio.Task[None], list[RunRecordRow]] | None = None
        self.dropped_total = 0

    @property
    def records_total(self) -> int:
        return self.tracker.records_total

    def start(self) -> None:
        """The devices' leases as the ledger holds them now (restored at start)."""
        for device in self._devices.values():
            self.tracker.composition(device, self._ledger.on_device(device.uuid))
        self._keep(self.tracker.take())

    # -- what it hears ---------------------------------------------------------------------

    def on_published(self, events: Sequence[Event]) -> None:
        """Durable events: a lease change may have changed its device's composition."""
        lease_events = [e for e in events if e.kind.startswith("lease.")]
        for uuid in dict.fromkeys(e.device_uuid for e in lease_events if e.device_uuid):
            device = self._devices.get(uuid)
            if device is not None:
                self.tracker.composition(device, self._ledger.on_device(uuid))
        for event in lease_events:
            if event.kind in ENDED_KINDS and event.lease_id:
                self.tracker.forget(event.lease_id)
        self._keep(self.tracker.take())

    def on_window(self, window: WindowSample) -> None:
        started_s_ago = self._clock() - window.start_at
        self.tracker.telemetry(window.device_uuid, window.mean, started_s_ago=started_s_ago)

    def report(self, lease_id: str, units_done: float, *, owner: str | None) -> ProgressAnswer:
        """A progress report on a live lease, by its owner (``None``: the local socket)."""
        lease = self._ledger.get(lease_id)
        if lease is not None and owner is not None and lease.owner and lease.owner != owner:
            raise PermissionDeniedError(f"lease {lease_id} was made by another caller")
        if lease is None or not lease.state.holds_capacity:
            why = f"lease {lease_id} is {lease.state.value}" if lease else f"no lease {lease_id!r}"
            raise NotFoundError(f"{why} on this node: no progress to report")
        answer = self.tracker.report(lease_id, units_done)
        self._keep(self.tracker.take())
        return answer

    # -- writing ---------------------------------------------------------------------------

    def _keep(self, records: list[NodeRecord]) -> None:
        if not records:
            return
        at = self._clock()
        self._unwritten.extend(RunRecordRow(at, r.family, to_json(r.record)) for r in records)
        excess = len(self._unwritten) - MAX_UNWRITTEN
        if excess > 0:
            del self._unwritten[:excess]
            self.dropped_total += excess
            log.error("%d run record(s) dropped: the store cannot write", excess)
        self._wake.set()

    async def writer(self) -> None:
        """Write records as they come, several to a transaction (a supervised task)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self.flush():
                await asyncio.sleep(RETRY_S)
                self._wake.set()

    async def flush(self) -> bool:
        """Write what is waiting, after any write in flight (so a reader that flushed first
        sees every record made before); True when nothing is left unwritten.

        The write is a task of its own: a caller cancelled during it (the writer task at a
        stop) leaves it to end, and the next flush (``flush_at_stop``) learns its outcome
        first, so its records are neither lost nor written twice."""
        async with self._writing:
            if self._in_flight is not None and not await self._settle(*self._in_flight):
                return False
            if not self._unwritten:
                return True
            batch, self._unwritten = self._unwritten, []
            write = asyncio.ensure_future(self._store.add_run_records(batch))
            self._in_flight = (write, batch)
            return await self._settle(write, batch)

    async def _settle(self, write: asyncio.Task[None], batch: list[RunRecordRow]) -> bool:
        """The outcome of ``write``: True when it landed; its batch back in front of what
        waits when the store refused it."""
        try:
            await asyncio.shield(write)
        except Exception as exc:  # StateError, or the store's own: the batch waits again
            log.warning("cannot store %d run record(s) yet: %s", len(batch), exc)
            self._unwritten = batch + self._unwritten
            self._in_flight = None
            return False
        self._in_flight = None
        return True

    async def flush_at_stop(self) -> None:
        if not await self.flush():
            log.warning(
                "%d run record(s) could not be written before the stop", len(self._unwritten)
            )
