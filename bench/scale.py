"""Ordering and placing a batch of candidates at scale (readiness-aware batch admission).

For 100,000 and 1,000,000 candidates with request sizes drawn like the synthetic demand
(fractions of a GPU to 8 GPUs) and a score each (a predicted P(ready)), on a cluster shaped
like the openb GPU nodes (1,213 nodes, 8 GPUs each), it times ``order_and_place``: a stable
sort by score, then best-fit placement one by one, all in one run. Prediction is not
timed here (the compiled forest's rate is printed separately).

    python bench/scale.py [--rule best-fit]

The last line is one JSON object with ``seconds_1e5``, ``seconds_1e6`` and their ``ratio``
(10 would be linear). Targets: 1e6 in at most 3 s, ratio at most 12.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.admission.cluster import Cluster, order_and_place
from agent.admission.policy import Placement
from agent.estimator.readiness import DEFAULT_READINESS_DIR, ReadinessModel
from agent.sim.readiness_synth import GPUS, generate

NODES, GPUS_PER_NODE = 1213, 8


def candidates(count: int, seed: int) -> tuple[list[float], list[float]]:
    rng = np.random.default_rng(seed)
    sizes = np.asarray([s for s, _ in GPUS])
    weights = np.asarray([w for _, w in GPUS])
    gpus = rng.choice(sizes, size=count, p=weights / weights.sum())
    return gpus.tolist(), rng.random(count).tolist()


def timed(count: int, rule: Placement, repeats: int) -> tuple[float, int]:
    gpus, scores = candidates(count, seed=count)
    best = float("inf")
    placed = 0
    for _ in range(repeats):
        cluster = Cluster([GPUS_PER_NODE] * NODES, rule)
        started = time.perf_counter()
        slots = order_and_place(cluster, gpus, scores)
        best = min(best, time.perf_counter() - started)
        placed = sum(s is not None for s in slots)
    return best, placed


def prediction_rate() -> float:
    model = ReadinessModel.load(DEFAULT_READINESS_DIR)
    rows = generate(20_000, seed=1).rows
    started = time.perf_counter()
    model.predict(rows)
    return len(rows) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rule", choices=[p.value for p in Placement], default="best-fit")
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs each")
    args = parser.parse_args()
    rule = Placement(args.rule)
    small, placed_small = timed(100_000, rule, args.repeats)
    large, placed_large = timed(1_000_000, rule, args.repeats)
    print(f"{'candidates':>10} {'seconds':>8} {'placed':>7}")
    print(f"{100_000:>10} {small:>8.3f} {placed_small:>7}")
    print(f"{1_000_000:>10} {large:>8.3f} {placed_large:>7}")
    print(f"readiness predictions per second (compiled forest): {prediction_rate():,.0f}")
    print(
        json.dumps(
            {
                "rule": rule.value,
                "seconds_1e5": round(small, 3),
                "seconds_1e6": round(large, 3),
                "ratio": round(large / small, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
