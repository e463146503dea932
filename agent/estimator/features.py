"""Features of a co-location record, versioned. Pure.

For a target workload next to its peers on a device:

- the target's solo counters and thread percentage (``t.<counter>``, ``t.thread_pct``);
- the peers, without regard to order: their count, the sum and max of each counter
  (``p.sum.<counter>``, ``p.max.<counter>``), the sum of their thread percentages and of
  their memory as a fraction of the device (``p.thread_pct_sum``, ``p.memory_frac_sum``);
- the device: memory in GiB and a model class (``d.memory_gib``, ``d.class``);
- the device's counters while the set ran together, when the record has them (``dc.*``).

The feature list is chosen from the training data and stored with the model; a counter
missing from a record reads as 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agent.estimator.records import Record

FEATURE_VERSION = 1
GIB = 1024**3
# Coarse model classes by generation, oldest first; unknown models read as 0.
MODEL_CLASSES = (
    ("K80", 1),
    ("P100", 2),
    ("V100", 3),
    ("T4", 3),
    ("A10", 4),
    ("A100", 5),
    ("L4", 5),
    ("L40", 5),
    ("H100", 6),
    ("H200", 7),
    ("B200", 8),
)


def model_class(model: str) -> float:
    upper = model.upper()
    return float(max((cls for name, cls in MODEL_CLASSES if name in upper), default=0))


def counter_names(records: Iterable[Record]) -> tuple[list[str], list[str]]:
    """Workload counter names and device counter names present in the records, sorted."""
    workload: set[str] = set()
    device: set[str] = set()
    for record in records:
        workload.update(record.target.counters)
        for peer in record.peers:
            workload.update(peer.counters)
        if record.device_counters:
            device.update(record.device_counters)
    return sorted(workload), sorted(device)


def feature_names(workload_counters: Sequence[str], device_counters: Sequence[str]) -> list[str]:
    names = [f"t.{c}" for c in workload_counters] + ["t.thread_pct"]
    names += ["p.count", "p.thread_pct_sum", "p.memory_frac_sum"]
    names += [f"p.sum.{c}" for c in workload_counters]
    names += [f"p.max.{c}" for c in workload_counters]
    names += ["d.memory_gib", "d.class"]
    names += [f"dc.{c}" for c in device_counters]
    return names


def features(record: Record, names: Sequence[str]) -> list[float]:
    values = _values(record)
    return [values.get(name, 0.0) for name in names]


def _values(record: Record) -> dict[str, float]:
    values = {f"t.{k}": v for k, v in record.target.counters.items()}
    values["t.thread_pct"] = record.target.thread_pct
    peers = record.peers
    values["p.count"] = float(len(peers))
    values["p.thread_pct_sum"] = sum(p.thread_pct for p in peers)
    values["p.memory_frac_sum"] = sum(p.memory_bytes for p in peers) / record.gpu_memory_bytes
    for peer in peers:
        for name, value in peer.counters.items():
            values[f"p.sum.{name}"] = values.get(f"p.sum.{name}", 0.0) + value
            values[f"p.max.{name}"] = max(values.get(f"p.max.{name}", value), value)
    values["d.memory_gib"] = record.gpu_memory_bytes / GIB
    values["d.class"] = model_class(record.gpu_model)
    for name, value in (record.device_counters or {}).items():
        values[f"dc.{name}"] = value
    return values
