"""Per-lease metrics: what dcgm-exporter cannot say under MPS (its issue #388), where every
client of a device hides behind one MPS server and its per-process series carry no pod.

One series per live lease (reserved, admitted, ready), labelled ``lease``, ``pod``,
``namespace`` and ``device`` (its UUID); built at scrape time from the live leases, so an
ended lease leaves no series behind and the cardinality is bounded by the live leases.
:func:`lease_rows` is the pure part: the snapshot and the used memory in, one row per lease
out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from agent.core.snapshot import NodeSnapshot

LEASE_LABELS = ["lease", "pod", "namespace", "device"]
LIVE_STATES = ("reserved", "admitted", "ready")


@dataclass(frozen=True, slots=True)
class LeaseRow:
    lease_id: str
    pod: str  # the pod's name, "" for a lease made for no pod
    namespace: str  # the pod's namespace, ""  for a lease made for no pod
    device_uuid: str
    state: str
    memory_limit_bytes: int
    memory_used_bytes: int  # 0 when no process with NVML-reported memory is attributed
    threads_pct: float
    retention_estimate: float | None  # None: no estimate for it

    @property
    def labels(self) -> list[str]:
        return [self.lease_id, self.pod, self.namespace, self.device_uuid]


def split_pod(pod: str) -> tuple[str, str]:
    """``"<namespace>/<name>"`` as (namespace, name); ``("", "")`` for none."""
    namespace, _, name = pod.rpartition("/")
    return namespace, name


def lease_rows(snapshot: NodeSnapshot, memory_used_bytes: Mapping[str, int]) -> list[LeaseRow]:
    """One row per live lease, in lease id order."""
    rows = []
    for lease in sorted(snapshot.leases, key=lambda x: x.lease_id):
        namespace, pod = split_pod(lease.pod)
        rows.append(
            LeaseRow(
                lease_id=lease.lease_id,
                pod=pod,
                namespace=namespace,
                device_uuid=lease.device_uuid,
                state=lease.state.value,
                memory_limit_bytes=lease.memory_bytes,
                memory_used_bytes=memory_used_bytes.get(lease.lease_id, 0),
                threads_pct=lease.thread_pct,
                retention_estimate=snapshot.retention_estimates.get(lease.lease_id),
            )
        )
    return rows


def _gauge(name: str, documentation: str, *extra_labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=[*LEASE_LABELS, *extra_labels])


def lease_families(rows: list[LeaseRow]) -> Iterator[Metric]:
    limit = _gauge("gpushare_lease_memory_limit_bytes", "Memory limit of each live lease.")
    used = _gauge(
        "gpushare_lease_memory_used_bytes",
        "Device memory NVML reports in use by the lease's processes, summed (as of the "
        "janitor's last pass; 0 when none is attributed).",
    )
    threads = _gauge(
        "gpushare_lease_threads_pct", "Active thread percentage of each live lease (its cap)."
    )
    retention = _gauge(
        "gpushare_lease_retention_estimate_ratio",
        "Estimated retention of each lease next to the others on its device (1: none lost).",
    )
    state = _gauge(
        "gpushare_lease_state", "1 for the lease's state, 0 for its other live states.", "state"
    )
    for row in rows:
        limit.add_metric(row.labels, row.memory_limit_bytes)
        used.add_metric(row.labels, row.memory_used_bytes)
        threads.add_metric(row.labels, row.threads_pct)
        if row.retention_estimate is not None:
            retention.add_metric(row.labels, row.retention_estimate)
        for live in LIVE_STATES:
            state.add_metric([*row.labels, live], 1.0 if live == row.state else 0.0)
    yield from (limit, used, threads, retention, state)
