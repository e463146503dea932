"""Prediction time of the compiled forest against scikit-learn's predict, in one run.

Trains a 100-tree forest on synthetic records (the simulated node's contention model), then
times one record and a batch of 8 (a candidate and its peers) with both, and checks they
agree.

    python bench/estimator.py

Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.estimator.compiled import CompiledForest
from agent.estimator.training import matrix, train
from agent.sim.synth import runs


def per_call_ms(fn: object, x: np.ndarray, repeats: int) -> float:
    fn(x)  # type: ignore[operator]
    started = time.perf_counter()
    for _ in range(repeats):
        fn(x)  # type: ignore[operator]
    return (time.perf_counter() - started) / repeats * 1000


def main() -> None:
    records = runs(1500, seed=7)
    result = train(records, folds=2, trees=100, seed=0)
    x = matrix(records, result.names)
    compiled = CompiledForest.from_sklearn(result.forest)
    single, batch = x[:1], x[:8]
    figures = {
        "sklearn_single_ms": per_call_ms(result.forest.predict, single, 200),
        "compiled_single_ms": per_call_ms(compiled.predict, single, 2000),
        "sklearn_batch8_ms": per_call_ms(result.forest.predict, batch, 200),
        "compiled_batch8_ms": per_call_ms(compiled.predict, batch, 2000),
    }
    figures["speedup_single"] = figures["sklearn_single_ms"] / figures["compiled_single_ms"]
    figures["speedup_batch8"] = figures["sklearn_batch8_ms"] / figures["compiled_batch8_ms"]
    figures["max_abs_diff"] = float(np.abs(compiled.predict(x) - result.forest.predict(x)).max())
    figures["trees"] = 100
    figures["depth"] = compiled.depth
    print(f"{'':<10}{'sklearn':>12}{'compiled':>12}{'speedup':>10}")
    for name in ("single", "batch8"):
        print(
            f"{name:<10}{figures[f'sklearn_{name}_ms']:>10.3f}ms"
            f"{figures[f'compiled_{name}_ms']:>10.3f}ms{figures[f'speedup_{name}']:>10.1f}"
        )
    print(f"max |compiled - sklearn| over {len(x)} records: {figures['max_abs_diff']:.2e}")
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()
