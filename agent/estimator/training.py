"""Training the retention estimator (scikit-learn lives here and in no hot path).

Cross-validation is grouped by workload *family* (``family_of``: resnet50-bs32 and
resnet50-bs64 are one family), so every reported figure is for families the model never
saw; ``folds=0`` holds out one family at a time. The forest is a Random Forest with
monotonic constraints where the physics fixes the direction (``features.monotonic``: more
peer demand never raises the target's retention). Its out-of-family predictions calibrate
the conservative estimate (``calibration``): ``retention_lower`` comes with a coverage.

Next to the forest, on the same folds: the training mean, the utilisation-sum rule
(``min(1, 100 / sum of solo gpu_util)``) and the one-line gate "sum <= 120%". The forest is
kept only if, at floor 0.85 and at some coverage, its gate is at least as precise as that
one-line rule and admits at least as many good sets (the coverages where it does are stored:
``levels_beating_rule``); otherwise the model says so and the agent uses the rule
(``selected``).
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sklearn
from sklearn.ensemble import RandomForestRegressor
from sklearn.model_selection import GroupKFold

from agent.core.errors import ValidationError
from agent.estimator import calibration as cal
from agent.estimator.compiled import CompiledForest, _lower_quantile
from agent.estimator.evaluation import (
    FLOORS,
    GATE_FLOORS,
    baselines,
    beats,
    gate,
    scores,
    util_sum_rule,
)
from agent.estimator.features import (
    FEATURE_VERSION,
    counter_names,
    feature_names,
    features,
    monotonic,
)
from agent.estimator.records import Record, family_of

__all__ = ["FLOORS", "GATE_FLOORS", "gate", "scores", "util_sum_rule"]
TREE_QUANTILE = 0.1  # version 1's lower estimate, still scored for comparison


def matrix(records: Sequence[Record], names: Sequence[str]) -> np.ndarray[Any, Any]:
    return np.asarray([features(r, names) for r in records], dtype=np.float64)


@dataclass
class TrainResult:
    forest: RandomForestRegressor
    names: list[str]
    cv: dict[str, dict[str, float]]
    calibration: dict[str, Any] = field(default_factory=dict)
    selected: str = "forest"
    curve: dict[str, list[float]] = field(default_factory=dict)


def forest_for(names: Sequence[str], trees: int, seed: int) -> RandomForestRegressor:
    return RandomForestRegressor(
        n_estimators=trees,
        min_samples_leaf=2,
        random_state=seed,
        monotonic_cst=[monotonic(n) for n in names],
        n_jobs=1,
    )


def train(
    records: Sequence[Record],
    *,
    folds: int = 0,
    trees: int = 100,
    seed: int = 0,
    coverage: float = cal.DEFAULT_COVERAGE,
) -> TrainResult:
    labelled = [r for r in records if r.retention is not None]
    groups = [family_of(r.target) for r in labelled]
    families = len(set(groups))
    if families < 2:
        raise ValidationError("data", "training needs records of at least two workload families")
    coverage = round(coverage, 2)  # one of the stored levels
    if not cal.LEVELS[0] <= coverage <= cal.LEVELS[-1]:
        raise ValidationError("coverage", f"must be within [0.5, 0.99] (got {coverage})")
    names = feature_names(counter_names(labelled)[0])
    x = matrix(labelled, names)
    y = np.asarray([r.retention for r in labelled], dtype=np.float64)
    splits = min(folds, families) if folds > 0 else families
    mean, spread, low10, fold_mean = out_of_family(x, y, groups, names, splits, trees, seed)
    eps = cal.eps_of(spread)
    achieved, bounds = cal.grouped_coverage(y, mean, spread, groups, eps)
    at = cal.LEVELS.index(coverage)
    forest_cv = {**scores(y, mean), **gate(y, bounds[:, at])}
    forest_cv["coverage_nominal"] = coverage
    forest_cv["coverage_achieved"] = achieved[at]
    cv = {
        "forest": forest_cv,
        "mean": scores(y, fold_mean),
        **baselines(labelled, y),
        "forest_tree_q10": gate(y, low10),
    }
    calibration = cal.table(cal.conformity(y, mean, spread, eps), mean, eps, coverage)
    winning = [
        c for i, c in enumerate(cal.LEVELS) if beats(gate(y, bounds[:, i]), cv["util_sum_120"])
    ]
    calibration["levels_beating_rule"] = winning
    selected = "forest" if winning else "util_sum_rule"
    forest = forest_for(names, trees, seed).fit(x, y)
    curve = {"nominal": list(cal.LEVELS), "achieved": achieved}
    return TrainResult(forest, names, cv, calibration, selected, curve)


def out_of_family(
    x: np.ndarray[Any, Any],
    y: np.ndarray[Any, Any],
    groups: Sequence[str],
    names: Sequence[str],
    splits: int,
    trees: int,
    seed: int,
) -> tuple[Any, Any, Any, Any]:
    """Each record's forest mean, tree spread and 10% tree quantile from a forest that did
    not see its family, and the training mean of its fold."""
    mean, spread, low, fold_mean = (np.zeros_like(y) for _ in range(4))
    for train_idx, test_idx in GroupKFold(n_splits=splits).split(x, y, groups):
        forest = forest_for(names, trees, seed).fit(x[train_idx], y[train_idx])
        compiled = CompiledForest.from_sklearn(forest)
        per_tree = compiled.tree_predictions(x[test_idx])
        mean[test_idx] = per_tree.mean(axis=1)
        spread[test_idx] = per_tree.std(axis=1)
        low[test_idx] = _lower_quantile(per_tree, TREE_QUANTILE)
        fold_mean[test_idx] = y[train_idx].mean()
    return mean, spread, low, fold_mean


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
        "schema_version": 2,
        "feature_version": FEATURE_VERSION,
        "features": result.names,
        "monotonic": [monotonic(n) for n in result.names],
        "data_sha256": data_sha256,
        "records": records,
        "provenance": provenance,
        "selected": result.selected,
        "calibration": result.calibration,
        "cross_validation": result.cv,
        "coverage_curve": result.curve,
        "trees": len(result.forest.estimators_),
        "versions": {
            "python": platform.python_version(),
            "scikit-learn": sklearn.__version__,
            "numpy": np.__version__,
        },
    }
    (out / "model.json").write_text(json.dumps(metadata, indent=2) + "\n")
