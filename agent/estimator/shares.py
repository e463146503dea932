"""A third synthetic generator: inference models paired under MPS at complementary thread
shares. Pure.

Under MPS each client's SMs are bounded by its thread share, so two clients at ``th`` and
``100 - th`` percent do not fight over SMs; they fight over what MPS does not partition,
the L2 cache and the DRAM bandwidth. This world is unlike the other two
(``gpushare estimator synth --generator shares``):

- ten inference model families, each at a few batch sizes, with a hidden share of its time
  bound by memory (``bound``, larger where it moves more bytes) and a sensitivity to cache
  thrashing (``thrash``, larger where it leans on the L2), both only partly seen in its
  counters;
- counters are what a profiler gives **at the share** the workload runs at: ``l2_util`` and
  ``dram_util`` (percent of peak) and ``fb_used_bytes``; there is **no** ``gpu_util``, so
  the utilisation-sum rules do not apply;
- retention is relative to the same workload alone *at the same share*
  (``retention_basis: share``): the loss is interference only. The memory-bound part slows
  by the DRAM oversubscription (``max(1, total)``) and by the peer's L2 traffic
  (``1 + thrash * l2_peer`` beyond what the cache holds); noise grows with the slowdown.

Still a model, not a measurement: its records are synthetic and labelled so.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agent.estimator.records import Record, Workload

GIB = 1024**3
PROVENANCE = "synthetic: agent/estimator/shares.py (MPS shares generator) + noise"
GPUS = (("NVIDIA A100-SXM4-40GB", 40 * GIB), ("NVIDIA L40S", 48 * GIB))
FAMILIES = (
    "resnet50",
    "bert-base",
    "gpt2",
    "vit-b16",
    "yolov8",
    "unet",
    "efficientnet",
    "mobilenet",
    "t5-small",
    "whisper",
)
BATCHES = (1, 8, 32)
SHARES = (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0)


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    family: str
    memory_bytes: int
    dram: float  # DRAM bandwidth share alone on the whole device
    l2: float  # L2 throughput share alone on the whole device
    bound: float  # share of its time bound by memory
    thrash: float  # how much a peer's L2 traffic costs it


def models(rng: random.Random) -> list[Model]:
    result = []
    for family in FAMILIES:
        dram0, l20 = rng.uniform(0.3, 0.95), rng.uniform(0.3, 0.95)
        # memory-bound models move more bytes; cache-heavy ones suffer more from a thrash
        bound = min(0.95, 0.25 + 0.7 * dram0 + rng.uniform(-0.1, 0.1))
        thrash = max(0.1, 1.4 * l20 + rng.uniform(-0.3, 0.3))
        memory0 = rng.uniform(0.5, 4.0)
        for batch in BATCHES:
            scale = (batch / 8) ** 0.3
            result.append(
                Model(
                    f"{family}-bs{batch}",
                    family,
                    int(memory0 * (1 + batch / 16) * GIB),
                    min(0.95, dram0 * scale),
                    min(0.95, l20 * scale),
                    bound,
                    thrash,
                )
            )
    return result


def at_share(model: Model, share_pct: float) -> tuple[float, float]:
    """DRAM and L2 busy shares of the model alone at a thread share: fewer SMs issue fewer
    memory requests, less than in proportion."""
    fraction = share_pct / 100.0
    return min(1.0, model.dram * fraction**0.4), min(1.0, model.l2 * fraction**0.3)


def retention(model: Model, share_pct: float, peer: Model, peer_share_pct: float) -> float:
    dram, l2 = at_share(model, share_pct)
    peer_dram, peer_l2 = at_share(peer, peer_share_pct)
    bandwidth = max(1.0, dram + peer_dram)
    cache = 1.0 + model.thrash * max(0.0, l2 + peer_l2 - 0.5) * peer_l2
    time = (1 - model.bound) + model.bound * bandwidth * cache
    return 1.0 / time


def workload(model: Model, share_pct: float) -> Workload:
    dram, l2 = at_share(model, share_pct)
    counters = {
        "l2_util": round(100 * l2, 2),
        "dram_util": round(100 * dram, 2),
        "fb_used_bytes": float(model.memory_bytes),
    }
    return Workload(model.name, share_pct, model.memory_bytes, counters, model.family)


def runs(count: int, *, seed: int = 0, noise: float = 0.02) -> list[Record]:
    """``count`` pairs of different families at complementary shares, two records each."""
    rng = random.Random(seed)
    pool = models(rng)
    records: list[Record] = []
    while len(records) < 2 * count:
        gpu, memory = rng.choice(GPUS)
        a, b = rng.sample(pool, 2)
        if a.family == b.family or a.memory_bytes + b.memory_bytes > memory:
            continue
        share = rng.choice(SHARES)
        for target, own, peer, other in ((a, share, b, 100 - share), (b, 100 - share, a, share)):
            kept = retention(target, own, peer, other)
            spread = noise * (0.5 + 2 * (1 - kept))
            value = min(1.0, max(0.0, kept + rng.gauss(0.0, spread)))
            records.append(
                Record(
                    gpu,
                    memory,
                    workload(target, own),
                    (workload(peer, other),),
                    None,
                    round(value, 4),
                    retention_basis="share",
                )
            )
    return records
