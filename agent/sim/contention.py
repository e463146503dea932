"""The simulated node's contention model: what co-located workloads do to each other. Pure.

Each workload brings its *solo* counters (what it does alone on the device, canonical names)
and the thread percentage it may use. Two resources are modelled, each a rate with a
capacity of 1.0:

- compute: demand ``sm_active`` (or ``gpu_util / 100`` when that is all there is), capped by
  the thread percentage: ``c_i = min(sm_i, thread_pct_i / 100)``;
- memory bandwidth: demand ``dram_active`` (or ``mem_util / 100``), uncapped.

When the demands on a resource add up to more than 1.0, every workload gets the same
fraction of its demand (``1 / total``). A workload's retention is its slowest resource:
``min(granted_r / solo_r)`` over the resources it uses, where granted compute is already
capped by its thread percentage. So a workload alone at 100% threads keeps 1.0, two
workloads that each keep an SM 70% busy keep about 0.71 each, and a workload with little
memory traffic next to a bandwidth-heavy one loses little. Device counters are the sums of
what each workload achieves, capped at the device's limits; memory used is the sum of the
workloads' memory. This is a teaching model, not a measurement: data generated from it is
synthetic and labelled so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.estimator.features import busy_shares

IDLE_POWER_W = 70.0
BUSY_POWER_W = 700.0


@dataclass(frozen=True, slots=True)
class Load:
    counters: Mapping[str, float]
    thread_pct: float = 100.0
    memory_bytes: int = 0
    name: str = ""


def compute_demand(load: Load) -> float:
    return busy_shares(load.counters, load.thread_pct)[0]


def memory_demand(load: Load) -> float:
    return busy_shares(load.counters)[1]


def _share(demands: Sequence[float]) -> float:
    total = sum(demands)
    return 1.0 if total <= 1.0 else 1.0 / total


def retentions(loads: Sequence[Load]) -> list[float]:
    """Each workload's throughput next to the others, relative to running alone."""
    compute = [compute_demand(w) for w in loads]
    memory = [memory_demand(w) for w in loads]
    compute_share, memory_share = _share(compute), _share(memory)
    result = []
    for load, c, m in zip(loads, compute, memory, strict=True):
        solo_compute = load.counters.get("sm_active", load.counters.get("gpu_util", 0.0) / 100.0)
        ratios = []
        if solo_compute > 0:
            ratios.append(c * compute_share / solo_compute)
        if m > 0:
            ratios.append(memory_share)
        result.append(min([1.0, *ratios]))
    return result


def device_counters(loads: Sequence[Load]) -> dict[str, float]:
    """The device's counters while ``loads`` run together (idle values when none)."""
    kept = retentions(loads)
    sm = min(1.0, sum(compute_demand(w) * r for w, r in zip(loads, kept, strict=True)))
    dram = min(1.0, sum(memory_demand(w) * r for w, r in zip(loads, kept, strict=True)))
    tensor = min(
        1.0, sum(w.counters.get("tensor_active", 0.0) * r for w, r in zip(loads, kept, strict=True))
    )
    return {
        "sm_active": sm,
        "gpu_util": 100.0 * min(1.0, sm * 1.2) if sm > 0 else 0.0,
        "dram_active": dram,
        "mem_util": 100.0 * dram,
        "tensor_active": tensor,
        "fb_used_bytes": float(sum(w.memory_bytes for w in loads)),
        "power_w": IDLE_POWER_W + (BUSY_POWER_W - IDLE_POWER_W) * sm,
        "sm_clock_mhz": 1980.0 if sm > 0 else 345.0,
        "temperature_c": 32.0 + 40.0 * sm,
    }
