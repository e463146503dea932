"""Prometheus metrics, collected at scrape time from the agent's live state.

Every family has the ``gpushare_`` prefix and a unit suffix where it has a unit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agent import __version__
from agent.api.lease_metrics import lease_families, lease_rows
from agent.core.snapshot import LATENCY_BUCKETS_S, NodeSnapshot


@dataclass(frozen=True, slots=True)
class TelemetryStats:
    source: str
    samples_total: int
    errors_total: int
    up: bool = True


class AgentCollector(Collector):
    def __init__(
        self,
        snapshot: Callable[[], NodeSnapshot],
        telemetry: Callable[[], TelemetryStats],
        *,
        clock: Callable[[], float] = time.time,
        lease_memory: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._snapshot = snapshot
        self._telemetry = telemetry
        self._clock = clock
        self._lease_memory = lease_memory  # used bytes by lease id (NVML, summed)

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        yield from self._node(snapshot)
        yield from self._devices(snapshot)
        yield from self._telemetry_families(snapshot)
        yield from self._admission(snapshot)
        yield from lease_families(lease_rows(snapshot, self._lease_memory()))

    def _admission(self, snapshot: NodeSnapshot) -> Iterator[Metric]:
        stats = snapshot.admission
        outcomes = CounterMetricFamily(
            "gpushare_admissions",
            "Admission decisions by result and reason code.",
            labels=["result", "reason"],
        )
        for (result, reason), count in sorted(stats.outcomes.items()):
            outcomes.add_metric([result, reason], count)
        yield outcomes
        buckets = [
            (f"{bound:g}", count)
            for bound, count in zip(LATENCY_BUCKETS_S, stats.latency_buckets, strict=True)
        ]
        buckets.append(("+Inf", stats.latency_count))
        latency = HistogramMetricFamily(
            "gpushare_admission_decision_seconds",
            "Time from an Admit arriving to its durable answer.",
            buckets=buckets,
            sum_value=stats.latency_sum_s,
        )
        yield latency
        states = GaugeMetricFamily("gpushare_leases", "Live leases by state.", labels=["state"])
        counts: dict[str, int] = {}
        for lease in snapshot.leases:
            counts[lease.state.value] = counts.get(lease.state.value, 0) + 1
        for state in ("reserved", "admitted", "ready"):
            states.add_metric([state], counts.get(state, 0))
        yield states
        memory = GaugeMetricFamily(
            "gpushare_device_memory_committed_bytes",
            "Memory limits of the live leases on each device.",
            labels=["device"],
        )
        threads = GaugeMetricFamily(
            "gpushare_device_threads_committed_pct",
            "Thread percentages of the live leases on each device.",
            labels=["device"],
        )
        for entry in snapshot.ledger:
            memory.add_metric([entry.device_uuid], entry.memory_committed_bytes)
            threads.add_metric([entry.device_uuid], entry.threads_committed_pct)
        yield memory
        yield threads
        stranded = GaugeMetricFamily(
            "gpushare_stranded_memory_bytes", "Free memory no standard request size can use."
        )
        stranded.add_metric([], snapshot.stranded_memory_bytes)
        yield stranded
        ineffective = GaugeMetricFamily(
            "gpushare_ineffective_occupancy_ratio",
            "W: share of the node's device memory held by admitted leases not yet ready.",
        )
        ineffective.add_metric([], snapshot.ineffective_ratio)
        yield ineffective
        stranded_threads = GaugeMetricFamily(
            "gpushare_stranded_threads_pct", "Free thread budget no standard request can use."
        )
        stranded_threads.add_metric([], snapshot.stranded_thread_pct)
        yield stranded_threads

    def _node(self, snapshot: NodeSnapshot) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "gpushare_build_info",
            "Agent version and mode; always 1.",
            labels=["version", "simulated", "node"],
        )
        info.add_metric([__version__, str(snapshot.simulated).lower(), snapshot.node_name], 1)
        yield info
        actions = CounterMetricFamily(
            "gpushare_control_actions",
            "Actions of the control loops, by kind: janitor (terminate, report-unknown, "
            "release, fail-device, memory-violation) and degradation (degrade, evict, recover).",
            labels=["kind"],
        )
        for kind, count in sorted(snapshot.control_actions.items()):
            actions.add_metric([kind], count)
        yield actions
        mismatches = CounterMetricFamily(
            "gpushare_lease_identity_mismatches",
            "Processes whose GPUSHARE_LEASE_ID named a lease their cgroup contradicts, once per "
            "process (each a lease.identity_mismatch event; a security signal).",
        )
        mismatches.add_metric([], snapshot.lease_identity_mismatches_total)
        yield mismatches
        records = CounterMetricFamily(
            "gpushare_estimator_node_records",
            "Run records the retention estimator learns from, made from the node's own "
            "progress reports (ReportProgress) since the agent started.",
        )
        records.add_metric([], snapshot.estimator_node_records_total)
        yield records
        degraded = GaugeMetricFamily(
            "gpushare_device_degraded",
            "1 while the w-window rule holds the device degraded (closed to new leases).",
            labels=["device"],
        )
        for d in snapshot.devices:
            degraded.add_metric([d.uuid], 1.0 if d.uuid in snapshot.degraded_devices else 0.0)
        yield degraded

    def _devices(self, snapshot: NodeSnapshot) -> Iterator[Metric]:
        memory = GaugeMetricFamily(
            "gpushare_device_memory_bytes",
            "Total memory of each schedulable device.",
            labels=["device", "index", "model"],
        )
        for d in snapshot.devices:
            memory.add_metric([d.uuid, str(d.index), d.model], d.memory_bytes)
        yield memory
        up = GaugeMetricFamily(
            "gpushare_mps_daemon_up",
            "1 when the device's MPS control daemon answers.",
            labels=["device", "backend"],
        )
        for m in snapshot.mps:
            up.add_metric([m.device_uuid, m.backend], 1.0 if m.up else 0.0)
        yield up
        yield from self._mps_counts(snapshot)

    def _mps_counts(self, snapshot: NodeSnapshot) -> Iterator[Metric]:
        restarts = CounterMetricFamily(
            "gpushare_mps_daemon_restarts",
            "Restarts of the device's MPS control daemon.",
            labels=["device"],
        )
        drift = CounterMetricFamily(
            "gpushare_mps_defaults_drift",
            "Times the daemon's defaults were found changed behind the agent and re-applied.",
            labels=["device"],
        )
        pipes = CounterMetricFamily(
            "gpushare_mps_pipe_permission_violations",
            "Changes found in the mode or owner of the device's MPS pipe and log directories "
            "and pipe files (each reported as an mps.pipe_permissions event).",
            labels=["device"],
        )
        clients = GaugeMetricFamily(
            "gpushare_mps_clients",
            "MPS client processes connected to the device's servers.",
            labels=["device"],
        )
        for m in snapshot.mps:
            restarts.add_metric([m.device_uuid], m.restarts)
            drift.add_metric([m.device_uuid], m.defaults_drift_total)
            pipes.add_metric([m.device_uuid], m.pipe_permission_violations_total)
            clients.add_metric([m.device_uuid], sum(len(s.client_pids) for s in m.servers))
        yield restarts
        yield drift
        yield pipes
        yield clients

    def _telemetry_families(self, snapshot: NodeSnapshot) -> Iterator[Metric]:
        stats = self._telemetry()
        up = GaugeMetricFamily(
            "gpushare_telemetry_up",
            "1 when the last read of the counter source succeeded.",
            labels=["source"],
        )
        up.add_metric([stats.source], 1.0 if stats.up else 0.0)
        yield up
        stale = GaugeMetricFamily(
            "gpushare_telemetry_stale",
            "1 for a device whose counters are stale.",
            labels=["device"],
        )
        for uuid in (d.uuid for d in snapshot.devices):
            stale.add_metric([uuid], 1.0 if uuid in snapshot.stale_devices else 0.0)
        yield stale
        samples = CounterMetricFamily(
            "gpushare_telemetry_samples", "Device samples read.", labels=["source"]
        )
        samples.add_metric([stats.source], stats.samples_total)
        yield samples
        errors = CounterMetricFamily(
            "gpushare_telemetry_errors", "Failed reads of the counter source.", labels=["source"]
        )
        errors.add_metric([stats.source], stats.errors_total)
        yield errors
        age = GaugeMetricFamily(
            "gpushare_telemetry_sample_age_seconds",
            "Age of each device's newest sample.",
            labels=["device"],
        )
        now = self._clock()
        for s in snapshot.latest_samples:
            age.add_metric([s.device_uuid], max(0.0, now - s.taken_at))
        yield age
