"""A second synthetic generator, with contention physics unlike the simulated node's. Pure.

The simulated node (``agent.sim.contention``) shares each resource in proportion to demand
and a workload keeps its slowest resource: a hard ``min(1, 1 / total)``, its counters
DCGM-like (``sm_active``, ``dram_active``). A forest that only ever saw that world can learn
its exact shape; this generator exists to test on a world it has not seen
(``gpushare estimator synth --generator interference``):

- workloads come in *families* (a model architecture at batch sizes 16 to 128) that share a
  hidden sensitivity to interference; a larger batch keeps the SMs and the memory bus
  busier and uses more memory;
- counters are what nvidia-smi gives: ``gpu_util`` (time any kernel ran, which overstates SM
  activity by a family-specific factor), ``mem_util`` and ``fb_used_bytes``, nothing else;
- slowdown is smooth and multiplicative: compute ``((1 + c^p) / (1 + C^p))^(1/p)`` for own
  demand ``c`` and total ``C`` (p = 4), memory bandwidth the same with p = 2 scaled by the
  family's sensitivity, times a cache term that bites even under capacity
  (``1 - 0.25 s d sum(d_peers)``), and a penalty when memory is nearly full;
- noise grows with the slowdown.

Still a model, not a measurement: its records are synthetic and labelled so.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from agent.estimator.records import Record, Workload

GIB = 1024**3
PROVENANCE = "synthetic: agent/estimator/synthetic.py (interference generator) + noise"
GPUS = (("NVIDIA A10", 24 * GIB), ("NVIDIA L4", 24 * GIB), ("V100-SXM2-32GB", 32 * GIB))
FAMILIES = (
    "resnet50",
    "resnet18",
    "bert",
    "gpt2",
    "lstm",
    "transformer",
    "dlrm",
    "cyclegan",
    "a3c",
    "vit",
    "unet",
    "yolo",
)
BATCHES = (16, 32, 64, 128)


@dataclass(frozen=True, slots=True)
class Hidden:
    sm: float  # true SM activity alone
    dram: float
    sensitivity: float


def workloads(rng: random.Random) -> list[tuple[Workload, Hidden]]:
    result = []
    for family in FAMILIES:
        sm0, dram0 = rng.uniform(0.15, 0.6), rng.uniform(0.05, 0.5)
        memory0 = rng.uniform(0.8, 3.0)
        overstate, sensitivity = rng.uniform(1.1, 1.8), rng.uniform(0.4, 1.4)
        for batch in BATCHES:
            scale = (batch / 32) ** 0.4
            sm, dram = min(0.97, sm0 * scale), min(0.95, dram0 * scale)
            memory = int(memory0 * batch / 32 * GIB)
            counters = {
                "gpu_util": round(min(100.0, 100 * sm * overstate), 1),
                "mem_util": round(100 * dram, 1),
                "fb_used_bytes": float(memory),
            }
            workload = Workload(f"{family}-bs{batch}", 100.0, memory, counters, family)
            result.append((workload, Hidden(sm, dram, sensitivity)))
    return result


def _smooth(own: float, total: float, p: float) -> float:
    return float(((1 + own**p) / (1 + total**p)) ** (1 / p)) if total > 0 else 1.0


def retentions(members: Sequence[tuple[Workload, Hidden]], memory_fraction: float) -> list[float]:
    sm = [min(h.sm, w.thread_pct / 100) for w, h in members]
    dram = [h.dram for _w, h in members]
    result = []
    for i, (_workload, hidden) in enumerate(members):
        compute = _smooth(sm[i], sum(sm), 4.0)
        bandwidth = 1 - hidden.sensitivity * (1 - _smooth(dram[i], sum(dram), 2.0))
        cache = 1 - 0.25 * hidden.sensitivity * dram[i] * (sum(dram) - dram[i])
        full = 1 - max(0.0, memory_fraction - 0.85) * 2
        result.append(max(0.0, min(1.0, compute * bandwidth * cache * full)))
    return result


def runs(count: int, *, seed: int = 0, noise: float = 0.03) -> list[Record]:
    """``count`` co-location sets (mostly pairs, some of three) that fit in memory, one
    record per workload."""
    rng = random.Random(seed)
    pool = workloads(rng)
    records: list[Record] = []
    made = 0
    while made < count:
        model, memory = rng.choice(GPUS)
        chosen = [
            (_threads(w, rng.choice([50.0, 100.0, 100.0])), h)
            for w, h in rng.sample(pool, rng.choice([2, 2, 2, 3]))
        ]
        used = sum(w.memory_bytes for w, _h in chosen) / memory
        if used > 1.0:
            continue
        kept = retentions(chosen, used)
        made += 1
        for i, (target, _h) in enumerate(chosen):
            peers = tuple(w for j, (w, _h2) in enumerate(chosen) if j != i)
            spread = noise * (0.5 + 2 * (1 - kept[i]))
            value = min(1.0, max(0.0, kept[i] + rng.gauss(0.0, spread)))
            records.append(Record(model, memory, target, peers, None, round(value, 4)))
    return records


def _threads(workload: Workload, thread_pct: float) -> Workload:
    return Workload(
        workload.workload, thread_pct, workload.memory_bytes, workload.counters, workload.family
    )


# The family-shift world: retention a monotone function of the set's combined pressure,
# times a sensitivity of the target's *kind* (a few families each: the same architecture
# family trained differently) that the counters tell apart but that does not follow from
# them. A forest learns each kind's sensitivity from its signature counter (``pcie_util``)
# and, held out one family at a time, finds the family's siblings and looks good; a family
# of a kind it never saw gets the sensitivity of whichever kind's signature is nearest,
# which says nothing about its own. With ``transfer`` the sensitivity follows the
# signature (the same rule for every kind), and the correction carries to new kinds.
SHIFT_GPU = ("NVIDIA A100-SXM4-80GB", 80 * GIB)


@dataclass(frozen=True, slots=True)
class Kind:
    signature: float  # pcie_util, % (what tells the kind apart)
    sensitivity: float


def shift_workloads(
    rng: random.Random, kinds: int, per_kind: int, transfer: bool
) -> list[tuple[Workload, Hidden]]:
    result = []
    for k in range(kinds):
        signature = rng.uniform(5.0, 95.0)
        sensitivity = 0.5 + 1.2 * signature / 100 if transfer else rng.uniform(0.3, 2.0)
        for f in range(per_kind):
            family = f"kind{k}-net{f}"
            sm0, dram0 = rng.uniform(0.15, 0.5), rng.uniform(0.1, 0.45)
            own = Kind(signature + rng.uniform(-2.0, 2.0), sensitivity * rng.uniform(0.95, 1.05))
            for batch in BATCHES:
                scale = (batch / 32) ** 0.4
                sm, dram = min(0.97, sm0 * scale), min(0.95, dram0 * scale)
                counters = {
                    "gpu_util": round(100 * sm, 1),
                    "mem_util": round(100 * dram, 1),
                    "pcie_util": round(own.signature, 1),
                    "fb_used_bytes": float(int(rng.uniform(2.0, 6.0) * GIB)),
                }
                workload = Workload(f"{family}-bs{batch}", 100.0, 0, counters, family)
                result.append((workload, Hidden(sm, dram, own.sensitivity)))
    return result


def shift_retention(sm_total: float, dram_total: float, sensitivity: float) -> float:
    """Retention from the set's combined pressure and the target's sensitivity."""
    pressure = sm_total + 0.8 * dram_total
    loss = min(1.0, 0.35 * max(0.0, pressure - 1.0) ** 1.2)
    return float(max(0.0, 1.0 - sensitivity * loss))


def family_shift_runs(
    count: int,
    *,
    seed: int = 0,
    noise: float = 0.02,
    kinds: int = 6,
    per_kind: int = 3,
    transfer: bool = False,
) -> list[Record]:
    """``count`` pairs and triples on one GPU model, one record per workload."""
    rng = random.Random(seed)
    pool = shift_workloads(rng, kinds, per_kind, transfer)
    model, memory = SHIFT_GPU
    records: list[Record] = []
    for _ in range(count):
        chosen = rng.sample(pool, rng.choice([2, 2, 3]))
        sm_total = sum(h.sm for _w, h in chosen)
        dram_total = sum(h.dram for _w, h in chosen)
        for i, (target, hidden) in enumerate(chosen):
            peers = tuple(w for j, (w, _h) in enumerate(chosen) if j != i)
            kept = shift_retention(sm_total, dram_total, hidden.sensitivity)
            value = min(1.0, max(0.0, kept + rng.gauss(0.0, noise)))
            records.append(Record(model, memory, target, peers, None, round(value, 4)))
    return records
