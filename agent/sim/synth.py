"""Synthetic co-location runs from the simulated node's contention model.

Clearly synthetic: every retention here comes from ``agent.sim.contention`` plus noise, not
from a GPU. Used to train the default model and to test the estimator pipeline; real
measurements (``gpushare profile`` on a GPU) replace it where they exist.
"""

from __future__ import annotations

import random

from agent.estimator.records import Record, Workload
from agent.sim.contention import Load, retentions

GIB = 1024**3
GPUS = (("V100-SXM2-16GB", 16 * GIB), ("A100-SXM4-80GB", 80 * GIB), ("H100-SXM5-80GB", 80 * GIB))
PROVENANCE = "synthetic: the simulated node's contention model (agent/sim/contention.py) + noise"


def workloads(count: int, rng: random.Random) -> list[Workload]:
    result = []
    for i in range(count):
        sm = rng.uniform(0.1, 0.95)
        dram = rng.uniform(0.05, 0.9)
        memory = rng.randint(1, 12) * GIB
        counters = {
            "sm_active": sm,
            "dram_active": dram,
            "gpu_util": min(100.0, sm * 110),
            "mem_util": dram * 100,
            "tensor_active": sm * rng.uniform(0.0, 0.8),
            "fb_used_bytes": float(memory),
        }
        result.append(Workload(f"w{i:02d}", 100.0, memory, counters))
    return result


def runs(
    count: int, *, seed: int = 0, workload_count: int = 30, noise: float = 0.02
) -> list[Record]:
    """``count`` co-location sets of 2 or 3 workloads, one record per workload."""
    rng = random.Random(seed)
    pool = workloads(workload_count, rng)
    records: list[Record] = []
    for _ in range(count):
        model, memory = rng.choice(GPUS)
        chosen = [
            _with_threads(w, rng.choice([25.0, 50.0, 100.0]))
            for w in rng.sample(pool, rng.choice([2, 2, 3]))
        ]
        kept = retentions([Load(w.counters, w.thread_pct, w.memory_bytes) for w in chosen])
        for i, target in enumerate(chosen):
            peers = tuple(chosen[:i] + chosen[i + 1 :])
            value = min(1.0, max(0.0, kept[i] + rng.gauss(0.0, noise)))
            records.append(Record(model, memory, target, peers, None, round(value, 4)))
    return records


def _with_threads(workload: Workload, thread_pct: float) -> Workload:
    return Workload(workload.workload, thread_pct, workload.memory_bytes, workload.counters)
