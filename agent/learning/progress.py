"""Progress reports of the node's workloads, turned into run records for the retention
estimator. Pure: no I/O, one injected clock (the agent's monotonic one).

A device's *composition* is the set of its running leases (admitted or ready: a
reservation runs nothing). Each change of it closes the device's window and opens a new
one. A lease's rate in a window is ``(units at its last report - units at its first) /
(time between them)``, measured only when those reports span ``min_span_s`` or more.

- A window where the lease runs alone gives its *solo rate* (the latest such wins), known
  as soon as its reports there span ``min_span_s``, and updated until the window closes.
- A window where it ran next to other leases, with a rate, becomes one run record once a
  solo rate of the lease is known: when the window closes if one is, else as soon as a
  later solo window gives one (such windows wait, at most ``pending_per_lease`` per lease,
  the oldest dropped first). The record's retention is ``rate / solo rate``; a window
  faster than twice its solo rate (a solo rate measured in a warm-up) makes no record.
- When a lease ends, what is known of it is forgotten (its waiting windows too).

A record describes the target and its peers by their solo signatures (``workload_of``: the
retention gate's, from the request's counters or profile, with the profile's counters at
MPS shares: what the gate reads at admission), the device by its model and
memory, and the device's telemetry by the mean of the telemetry windows that fell wholly
inside the composition window (none: no device counters).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.core.errors import ValidationError
from agent.core.learning import ProgressAnswer
from agent.core.lease import Lease, LeaseState
from agent.core.types import Device
from agent.estimator.records import Record, Workload

RUNNING = frozenset({LeaseState.ADMITTED, LeaseState.READY})
PENDING_PER_LEASE = 16  # co-located windows kept per lease while its solo rate is unknown
RETENTION_MAX = 2.0
UNKNOWN_FAMILY = "unknown"


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A run record made on this node, with the lease and family of its target."""

    lease_id: str
    family: str
    record: Record


@dataclass(slots=True)
class _Span:
    """A lease's first and last report in one window: (time, units) each."""

    first_at: float
    first_units: float
    last_at: float
    last_units: float

    @property
    def span_s(self) -> float:
        return self.last_at - self.first_at

    def rate(self, min_span_s: float) -> float | None:
        if self.span_s < min_span_s or self.span_s <= 0:
            return None
        return (self.last_units - self.first_units) / self.span_s


@dataclass(slots=True)
class _Window:
    device: Device
    members: dict[str, Lease]
    opened_at: float
    spans: dict[str, _Span] = field(default_factory=dict)
    counter_sums: dict[str, float] = field(default_factory=dict)
    counter_windows: int = 0

    def device_counters(self) -> dict[str, float] | None:
        if not self.counter_windows:
            return None
        return {k: v / self.counter_windows for k, v in self.counter_sums.items()}


@dataclass(frozen=True, slots=True)
class _Colocated:
    """A closed window in which a lease ran next to others, with its rate there."""

    device: Device
    target: Lease
    peers: tuple[Lease, ...]
    rate_per_s: float
    device_counters: Mapping[str, float] | None


def family_of(lease: Lease) -> str:
    return lease.profile or lease.workload or UNKNOWN_FAMILY


def retention(rate_per_s: float, solo_rate_per_s: float) -> float | None:
    """``rate / solo rate``; None past ``RETENTION_MAX``: no co-location doubles a speed,
    so the solo rate was not one (a warm-up)."""
    value = max(0.0, rate_per_s / solo_rate_per_s)
    return round(value, 4) if value <= RETENTION_MAX else None


class ProgressTracker:
    def __init__(
        self,
        *,
        clock: Callable[[], float],
        min_span_s: float,
        workload_of: Callable[[Lease], Workload],
        pending_per_lease: int = PENDING_PER_LEASE,
    ) -> None:
        self._clock = clock
        self._min_span_s = min_span_s
        self._workload_of = workload_of
        self._pending_per_lease = pending_per_lease
        self._windows: dict[str, _Window] = {}  # by device UUID
        self._device_of: dict[str, str] = {}  # lease id -> the device of its open window
        self._units: dict[str, float] = {}  # lease id -> its last report
        self._solo: dict[str, float] = {}  # lease id -> its latest solo rate
        self._pending: dict[str, deque[_Colocated]] = {}
        self._made: dict[str, int] = {}  # lease id -> records made from its windows
        self._outbox: list[NodeRecord] = []  # made, not yet taken
        self.records_total = 0

    # -- what the runtime tells it ---------------------------------------------------------

    def composition(self, device: Device, leases: Sequence[Lease]) -> None:
        """The leases on ``device`` now; when its running set changed, the open window
        closes (making records) and a new one opens."""
        running = {x.lease_id: x for x in leases if x.state in RUNNING}
        window = self._windows.get(device.uuid)
        if window is not None and window.members.keys() == running.keys():
            return
        if window is not None:
            self._close(window)
        self._windows[device.uuid] = _Window(device, running, self._clock())
        for lease_id in running:
            self._device_of[lease_id] = device.uuid

    def take(self) -> list[NodeRecord]:
        """The records made since the last call."""
        made, self._outbox = self._outbox, []
        return made

    def report(self, lease_id: str, units_done: float) -> ProgressAnswer:
        """A lease's cumulative units, at the agent's time now. ValidationError when not
        finite, negative, or below its previous report."""
        if not math.isfinite(units_done) or units_done < 0:
            raise ValidationError(
                "units_done", f"must be a finite number >= 0 (got {units_done!r})"
            )
        previous = self._units.get(lease_id)
        if previous is not None and units_done < previous:
            raise ValidationError(
                "units_done",
                f"went backwards: {units_done:g} after {previous:g} (units_done counts the "
                "work done since the workload started)",
            )
        self._units[lease_id] = units_done
        window = self._window_of(lease_id)
        if window is None:
            return ProgressAnswer(lease_id, records=self._made.get(lease_id, 0))
        now = self._clock()
        span = window.spans.get(lease_id)
        if span is None:
            span = window.spans[lease_id] = _Span(now, units_done, now, units_done)
        span.last_at, span.last_units = now, units_done
        rate = span.rate(self._min_span_s)
        if rate is not None and len(window.members) == 1:
            self._solo_rate(lease_id, rate)
        return ProgressAnswer(
            lease_id,
            window_s=span.span_s,
            rate_per_s=rate or 0.0,
            peers=len(window.members) - 1,
            records=self._made.get(lease_id, 0),
        )

    def telemetry(
        self, device_uuid: str, mean: Mapping[str, float], *, started_s_ago: float
    ) -> None:
        """A closed telemetry window of a device, which began ``started_s_ago``: it counts
        toward the open window's device counters when it lies wholly inside it."""
        window = self._windows.get(device_uuid)
        if window is None or self._clock() - started_s_ago < window.opened_at:
            return
        for name, value in mean.items():
            window.counter_sums[name] = window.counter_sums.get(name, 0.0) + value
        window.counter_windows += 1

    def forget(self, lease_id: str) -> None:
        """The lease ended: nothing more can be learned of it."""
        if lease_id in self._device_of and self._window_of(lease_id) is not None:
            return  # still in an open window (the runtime tells the composition first)
        for known in (self._device_of, self._units, self._solo, self._pending, self._made):
            known.pop(lease_id, None)

    # -- reading ---------------------------------------------------------------------------

    def pending(self, lease_id: str) -> int:
        """Co-located windows of the lease waiting for its solo rate."""
        return len(self._pending.get(lease_id, ()))

    def solo_rate(self, lease_id: str) -> float | None:
        return self._solo.get(lease_id)

    # -- closing a window ------------------------------------------------------------------

    def _window_of(self, lease_id: str) -> _Window | None:
        window = self._windows.get(self._device_of.get(lease_id, ""))
        return window if window is not None and lease_id in window.members else None

    def _close(self, window: _Window) -> None:
        rates = {
            lease_id: rate
            for lease_id, span in window.spans.items()
            if lease_id in window.members and (rate := span.rate(self._min_span_s)) is not None
        }
        if len(window.members) == 1:
            for lease_id, rate in rates.items():
                self._solo_rate(lease_id, rate)
            return
        counters = window.device_counters()
        for lease_id, rate in rates.items():
            target = window.members[lease_id]
            peers = tuple(x for x in window.members.values() if x.lease_id != lease_id)
            colocated = _Colocated(window.device, target, peers, rate, counters)
            solo = self._solo.get(lease_id)
            if solo is not None:
                self._record(colocated, solo)
            else:
                waiting = self._pending.setdefault(lease_id, deque(maxlen=self._pending_per_lease))
                waiting.append(colocated)

    def _solo_rate(self, lease_id: str, rate_per_s: float) -> None:
        """The lease runs alone at this rate: its solo rate (if it made progress), and the
        records of its co-located windows that waited for one."""
        if rate_per_s <= 0:
            return
        self._solo[lease_id] = rate_per_s
        for colocated in self._pending.pop(lease_id, ()):
            self._record(colocated, rate_per_s)

    def _record(self, colocated: _Colocated, solo_rate_per_s: float) -> None:
        target = colocated.target
        kept = retention(colocated.rate_per_s, solo_rate_per_s)
        if kept is None:
            return
        record = Record(
            colocated.device.model,
            colocated.device.memory_bytes,
            self._workload(target),
            tuple(self._workload(x) for x in colocated.peers),
            colocated.device_counters,
            kept,
            retention_basis="share",  # against its rate alone at its own share
        )
        self._made[target.lease_id] = self._made.get(target.lease_id, 0) + 1
        self.records_total += 1
        self._outbox.append(NodeRecord(target.lease_id, family_of(target), record))

    def _workload(self, lease: Lease) -> Workload:
        signature = self._workload_of(lease)
        return Workload(
            lease.profile or lease.workload or lease.lease_id,
            lease.thread_pct,
            lease.memory_bytes,
            dict(signature.counters),
            family_of(lease),
            dict(signature.share_counters),
        )
