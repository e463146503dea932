"""Training and evaluating the retention estimator (scikit-learn lives here and in no hot path).

Cross-validation is grouped by the target workload, so every reported error is for
workloads the model never saw. Next to the forest, two baselines are scored on the same
folds: the training mean, and a utilisation-sum rule (share only if the set's solo
``gpu_util`` adds up to at most 100%: predict 1.0, else 100 / sum).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import sklearn
from sklearn.ensemble import RandomForestRegressor
from sklearn.model_selection import GroupKFold

from agent.core.errors import ValidationError
from agent.estimator.compiled import CompiledForest
from agent.estimator.features import FEATURE_VERSION, counter_names, feature_names, features
from agent.estimator.records import Record

FLOORS = (0.8, 0.9)
GATE_FLOORS = (0.8, 0.85, 0.9)
LOWER_QUANTILE = 0.1


def matrix(records: Sequence[Record], names: Sequence[str]) -> np.ndarray[Any, Any]:
    return np.asarray([features(r, names) for r in records], dtype=np.float64)


def util_sum_rule(record: Record) -> float:
    total = record.target.counters.get("gpu_util", 0.0) + sum(
        p.counters.get("gpu_util", 0.0) for p in record.peers
    )
    return 1.0 if total <= 100.0 else 100.0 / total


def scores(truth: npt.ArrayLike, predicted: npt.ArrayLike) -> dict[str, float]:
    t = np.asarray(truth)
    p = np.asarray(predicted)
    result = {"mae": float(np.mean(np.abs(t - p))), "rmse": float(math.sqrt(np.mean((t - p) ** 2)))}
    for floor in FLOORS:
        result[f"accuracy_at_{floor}"] = float(np.mean((t >= floor) == (p >= floor)))
    return result


def gate(truth: npt.ArrayLike, lower: npt.ArrayLike) -> dict[str, float]:
    """Admit when the conservative estimate meets the floor: precision (admitted sets that
    really keep the floor) and recall (such sets that were admitted)."""
    t, low = np.asarray(truth), np.asarray(lower)
    result = {}
    for floor in GATE_FLOORS:
        admitted, good = low >= floor, t >= floor
        result[f"gate_precision_at_{floor}"] = (
            float(np.mean(good[admitted])) if admitted.any() else 1.0
        )
        result[f"gate_recall_at_{floor}"] = float(np.mean(admitted[good])) if good.any() else 1.0
    return result


@dataclass
class TrainResult:
    forest: RandomForestRegressor
    names: list[str]
    cv: dict[str, dict[str, float]]


def train(
    records: Sequence[Record], *, folds: int = 5, trees: int = 100, seed: int = 0
) -> TrainResult:
    labelled = [r for r in records if r.retention is not None]
    groups = [r.target.workload for r in labelled]
    if len(set(groups)) < 2:
        raise ValidationError("data", "training needs records of at least two workloads")
    names = feature_names(*counter_names(labelled))
    x = matrix(labelled, names)
    y = np.asarray([r.retention for r in labelled], dtype=np.float64)
    cv = cross_validate(
        labelled, x, y, groups, folds=min(folds, len(set(groups))), trees=trees, seed=seed
    )
    forest = _forest(trees, seed).fit(x, y)
    return TrainResult(forest, names, cv)


def _forest(trees: int, seed: int) -> RandomForestRegressor:
    return RandomForestRegressor(n_estimators=trees, min_samples_leaf=2, random_state=seed)


def cross_validate(
    records: Sequence[Record],
    x: np.ndarray[Any, Any],
    y: np.ndarray[Any, Any],
    groups: Sequence[str],
    *,
    folds: int,
    trees: int,
    seed: int,
) -> dict[str, dict[str, float]]:
    predicted = {
        "forest": np.zeros_like(y),
        "mean": np.zeros_like(y),
        "util_sum_rule": np.asarray([util_sum_rule(r) for r in records]),
    }
    lower = np.zeros_like(y)
    for train_idx, test_idx in GroupKFold(n_splits=folds).split(x, y, groups):
        forest = _forest(trees, seed).fit(x[train_idx], y[train_idx])
        mean, low = CompiledForest.from_sklearn(forest).predict_with_lower(
            x[test_idx], quantile=LOWER_QUANTILE
        )
        predicted["forest"][test_idx] = mean
        lower[test_idx] = low
        predicted["mean"][test_idx] = y[train_idx].mean()
    result = {name: scores(y, values) for name, values in predicted.items()}
    result["forest"].update(gate(y, lower))
    return result


def data_hash(lines: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode())
    return digest.hexdigest()


def save(
    result: TrainResult, out: Path, *, data_sha256: str, records: int, provenance: str
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    CompiledForest.from_sklearn(result.forest).save(out / "forest.npz")
    metadata = {
        "schema_version": 1,
        "feature_version": FEATURE_VERSION,
        "features": result.names,
        "data_sha256": data_sha256,
        "records": records,
        "provenance": provenance,
        "lower_quantile": LOWER_QUANTILE,
        "cross_validation": result.cv,
        "trees": len(result.forest.estimators_),
        "versions": {
            "python": platform.python_version(),
            "scikit-learn": sklearn.__version__,
            "numpy": np.__version__,
        },
    }
    (out / "model.json").write_text(json.dumps(metadata, indent=2) + "\n")
