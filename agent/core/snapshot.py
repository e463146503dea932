"""The node as the API and the metrics see it at one instant: its devices and what each
holds, its MPS daemons, the latest counters, its leases, the admission counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.core.lease import Lease
from agent.core.mpsstate import MpsDaemonState
from agent.core.samples import Sample, WindowSample
from agent.core.types import Device


@dataclass(frozen=True, slots=True)
class DeviceLedger:
    """What a device holds, and why it takes nothing now (if it does not)."""

    device_uuid: str
    memory_committed_bytes: int
    threads_committed_pct: float
    leases: int
    closed: str = ""
    closed_detail: str = ""


@dataclass(frozen=True, slots=True)
class GoneDevice:
    """A device the node no longer has (a GPU off the bus, MIG repartitioned) whose leases
    were failed: found missing at start, or gone at run time."""

    device_uuid: str
    since: float  # seconds since the Unix epoch
    leases_failed: int
    when: str  # "at start" or "at run time"


LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(frozen=True, slots=True)
class AdmissionStats:
    """Admission counts by ``(result, reason)`` and a latency histogram of Admit decisions."""

    outcomes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    latency_buckets: tuple[int, ...] = (0,) * len(LATENCY_BUCKETS_S)  # cumulative counts
    latency_sum_s: float = 0.0
    latency_count: int = 0


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """The node as the API and the metrics see it at one instant."""

    node_name: str
    simulated: bool
    taken_at: float
    devices: tuple[Device, ...]
    mps: tuple[MpsDaemonState, ...] = ()
    latest_samples: tuple[Sample, ...] = ()
    latest_windows: tuple[WindowSample, ...] = ()
    telemetry_source: str = ""
    stale_devices: tuple[str, ...] = ()
    leases: tuple[Lease, ...] = ()
    ledger: tuple[DeviceLedger, ...] = ()
    gone_devices: tuple[GoneDevice, ...] = ()
    stranded_memory_bytes: int = 0
    stranded_thread_pct: float = 0.0
    last_event_seq: int = 0
    retention_estimates: Mapping[str, float] = field(default_factory=dict)
    ineffective_ratio: float = 0.0  # W: memory held by admitted, not-ready leases / node memory
    injector: str = ""  # "nri", "device-plugin" or "" (see GetNodeResponse.injector)
    admission: AdmissionStats = field(default_factory=AdmissionStats)
    control_actions: Mapping[str, int] = field(default_factory=dict)  # janitor, degradation
    degraded_devices: tuple[str, ...] = ()
    # processes whose GPUSHARE_LEASE_ID named a lease their cgroup contradicts (security)
    lease_identity_mismatches_total: int = 0
    # run records made from the node's own progress reports since the agent started
    estimator_node_records_total: int = 0
