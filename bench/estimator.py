"""Prediction time of the compiled forest against scikit-learn's predict, in one run.

Trains a 100-tree forest on synthetic records (the simulated node's contention model), then
times one record and a batch of 8 (a candidate and its peers) with both, and checks they
agree: the mean to 1e-9, and the calibrated lower estimate (mean, trees' spread, the stored
conformal quantile) against the same formula on scikit-learn's own per-tree predictions.

    python bench/estimator.py              # speed and exactness
    python bench/estimator.py --quality    # cross-generator and device-counter studies

Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sklearn.model_selection import GroupKFold

from agent.estimator import calibration as cal
from agent.estimator.compiled import CompiledForest
from agent.estimator.evaluation import baselines, gate
from agent.estimator.features import counter_names, feature_names
from agent.estimator.model import RetentionModel
from agent.estimator.records import Record, Workload, family_of
from agent.estimator.synthetic import runs as interference
from agent.estimator.training import forest_for, matrix, save, train
from agent.sim.contention import Load, device_counters
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
    with tempfile.TemporaryDirectory() as folder:
        save(result, Path(folder), data_sha256="bench", records=len(records), provenance="bench")
        model = RetentionModel.load(Path(folder))
    single, batch = x[:1], x[:8]
    figures = {
        "sklearn_single_ms": per_call_ms(result.forest.predict, single, 200),
        "compiled_single_ms": per_call_ms(compiled.predict, single, 2000),
        "sklearn_batch8_ms": per_call_ms(result.forest.predict, batch, 200),
        "compiled_batch8_ms": per_call_ms(compiled.predict, batch, 2000),
        "calibrated_single_ms": per_call_ms(model.predict_rows, single, 2000),
    }
    figures["speedup_single"] = figures["sklearn_single_ms"] / figures["compiled_single_ms"]
    figures["speedup_batch8"] = figures["sklearn_batch8_ms"] / figures["compiled_batch8_ms"]
    reference = result.forest.predict(x)
    figures["max_abs_diff"] = float(np.abs(compiled.predict(x) - reference).max())
    per_tree = np.stack([t.predict(x.astype(np.float32)) for t in result.forest.estimators_])
    calibration = model.metadata["calibration"]
    expected = cal.lower(
        reference,
        per_tree.std(axis=0),
        cal.q_at(calibration, calibration["coverage"]),
        calibration["eps"],
        calibration["edges"],
    )
    figures["max_abs_diff_lower"] = float(np.abs(model.predict_rows(x)[1] - expected).max())
    figures["trees"] = 100
    figures["depth"] = compiled.depth
    print(f"{'':<10}{'sklearn':>12}{'compiled':>12}{'speedup':>10}")
    for name in ("single", "batch8"):
        print(
            f"{name:<10}{figures[f'sklearn_{name}_ms']:>10.3f}ms"
            f"{figures[f'compiled_{name}_ms']:>10.3f}ms{figures[f'speedup_{name}']:>10.1f}"
        )
    print(f"calibrated mean + lower, one record: {figures['calibrated_single_ms']:.3f}ms")
    print(f"max |compiled - sklearn| over {len(x)} records: {figures['max_abs_diff']:.2e}")
    print(f"max |lower - reference| over {len(x)} records: {figures['max_abs_diff_lower']:.2e}")
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in figures.items()}))


SMI = frozenset({"gpu_util", "mem_util", "fb_used_bytes"})


def smi_only(records: list[Record]) -> list[Record]:
    """The records with only the counters nvidia-smi gives (what both generators share)."""

    def keep(w: Workload) -> Workload:
        counters = {k: v for k, v in w.counters.items() if k in SMI}
        return Workload(w.workload, w.thread_pct, w.memory_bytes, counters, w.family)

    return [
        Record(
            r.gpu_model,
            r.gpu_memory_bytes,
            keep(r.target),
            tuple(map(keep, r.peers)),
            r.device_counters,
            r.retention,
        )
        for r in records
    ]


def judged(model: RetentionModel, records: list[Record], train_mean: float) -> dict[str, float]:
    truth = np.asarray([r.retention for r in records], dtype=np.float64)
    mean, lower = (np.asarray(v) for v in model.predict(records))
    rule = baselines(records, truth)["util_sum_120"]
    forest = gate(truth, lower)
    return {
        "mae": float(np.mean(np.abs(truth - mean))),
        "mae_ratio": float(np.mean(np.abs(truth - mean)) / np.mean(np.abs(truth - train_mean))),
        "coverage": float(np.mean(truth >= lower)),
        "precision_0.85": forest["gate_precision_at_0.85"],
        "recall_0.85": forest["gate_recall_at_0.85"],
        "rule120_precision_0.85": rule["gate_precision_at_0.85"],
        "rule120_recall_0.85": rule["gate_recall_at_0.85"],
        "good_share_0.85": float(np.mean(truth >= 0.85)),
    }


def own_cv(cv: dict[str, dict[str, float]]) -> dict[str, float]:
    forest, rule = cv["forest"], cv["util_sum_120"]
    return {
        "mae_ratio": forest["mae"] / cv["mean"]["mae"],
        "coverage": forest["coverage_achieved"],
        "precision_0.85": forest["gate_precision_at_0.85"],
        "recall_0.85": forest["gate_recall_at_0.85"],
        "rule120_precision_0.85": rule["gate_precision_at_0.85"],
        "rule120_recall_0.85": rule["gate_recall_at_0.85"],
    }


def cross_generator() -> dict[str, dict[str, float]]:
    """Train on one generator, test on the other (nvidia-smi counters in both)."""
    worlds = {
        "contention": smi_only(runs(1200, seed=11)),
        "interference": interference(1200, seed=12),
    }
    result = {}
    for source, target in (("contention", "interference"), ("interference", "contention")):
        trained = train(worlds[source], folds=5, trees=40, seed=0)
        with tempfile.TemporaryDirectory() as folder:
            save(trained, Path(folder), data_sha256="q", records=1, provenance=source)
            model = RetentionModel.load(Path(folder))
        train_mean = float(np.mean([r.retention for r in worlds[source]]))
        result[f"{source} grouped CV"] = own_cv(trained.cv)
        result[f"{source} -> {target}"] = judged(model, worlds[target], train_mean)
    return result


def device_counter_study() -> dict[str, float]:
    """Why device counters hurt: train with the co-run device counters (as ``gpushare
    profile`` records them), then predict held-out families with them as recorded, and as
    the live gate builds its rows (it has none: they read 0); next to no device counters."""
    plain = runs(1200, seed=21)
    records = [
        Record(
            r.gpu_model,
            r.gpu_memory_bytes,
            r.target,
            r.peers,
            device_counters(
                [Load(w.counters, w.thread_pct, w.memory_bytes) for w in (r.target, *r.peers)]
            ),
            r.retention,
        )
        for r in plain
    ]
    names = feature_names(counter_names(records)[0])
    with_dc = names + [f"dc.{c}" for c in counter_names(records)[1]]
    y = np.asarray([r.retention for r in records], dtype=np.float64)
    groups = [family_of(r.target) for r in records]
    x_dc, x_plain = matrix(records, with_dc), matrix(records, names)
    x_live = x_dc.copy()
    x_live[:, len(names) :] = 0.0
    errors: dict[str, list[float]] = {"recorded": [], "live": [], "none": [], "mean": []}
    for tr, te in GroupKFold(n_splits=5).split(x_dc, y, groups):
        forest = forest_for(with_dc, 40, 0).fit(x_dc[tr], y[tr])
        errors["recorded"] += list(np.abs(forest.predict(x_dc[te]) - y[te]))
        errors["live"] += list(np.abs(forest.predict(x_live[te]) - y[te]))
        alone = forest_for(names, 40, 0).fit(x_plain[tr], y[tr])
        errors["none"] += list(np.abs(alone.predict(x_plain[te]) - y[te]))
        errors["mean"] += list(np.abs(y[tr].mean() - y[te]))
    base = float(np.mean(errors["mean"]))
    return {f"mae_ratio_{k}": float(np.mean(v)) / base for k, v in errors.items() if k != "mean"}


def quality() -> None:
    figures: dict[str, object] = {"cross_generator": cross_generator()}
    figures["device_counters"] = device_counter_study()
    for name, values in figures["cross_generator"].items():  # type: ignore[attr-defined]
        print(f"{name:<32}" + " ".join(f"{k}={v:.3f}" for k, v in values.items()))
    print(
        "device counters: "
        + " ".join(
            f"{k}={v:.3f}"
            for k, v in figures["device_counters"].items()  # type: ignore[attr-defined]
        )
    )
    print(json.dumps(_rounded(figures)))


def _rounded(value: object) -> object:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 4) if isinstance(value, float) else value


if __name__ == "__main__":
    if "--quality" in sys.argv[1:]:
        quality()
    else:
        main()
