"""Training the retention estimator (scikit-learn lives here and in no hot path).

Cross-validation is grouped by workload *family* (``family_of``: resnet50-bs32 and
resnet50-bs64 are one family), so every reported figure is for families the model never
saw; ``folds=0`` holds out one family at a time. Training:

1. **Checks each monotonic constraint** (``features.monotonic``: more peer demand never
   raises the target's retention), one resource at a time (``constraint_group``): a group
   whose removal lowers the grouped-CV error by more than ``CONSTRAINT_TOLERANCE`` does not
   hold in these records and is dropped.
2. **Picks the regression**: the Random Forest or a ridge line (``linear``), whichever has
   the lower out-of-family MAE; ``predicted_retention`` is always its estimate. A dataset on
   which neither beats the training mean (by ``SIGNAL_MARGIN``) is refused, with the
   figures.
3. **Calibrates** from the winner's out-of-family residuals: the conservative
   ``retention_lower`` at a coverage (``calibration``) and the predictive distribution
   behind P(retention >= floor) (``operating``).
4. **Chooses the gate's operating point**: for every floor and precision, the threshold on
   P(retention >= floor) with the most recall at that precision, and the precision it
   keeps on families its threshold never saw.
5. **Scores the baselines that apply** (``evaluation.baselines``: the utilisation-sum rules
   only when the records carry ``gpu_util``) on the same folds.
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
from agent.estimator import operating
from agent.estimator.compiled import CompiledForest
from agent.estimator.evaluation import GATE_FLOORS, baselines, gate, scores
from agent.estimator.features import (
    FEATURE_VERSION,
    counter_names,
    feature_names,
    features,
    monotonic,
)
from agent.estimator.linear import LinearModel
from agent.estimator.records import Record, family_of

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
CONSTRAINT_TOLERANCE = 0.02  # relative MAE a constraint group may cost before it is dropped
SIGNAL_MARGIN = 0.05  # an estimate must beat the training mean's MAE by this much (relative)
# Half the features per split: decorrelated trees travel to unseen families better (on the
# synthetic worlds, out-of-family MAE 2-4% lower and the gate's recall up to 3 points higher
# at the same precision than with every feature).
MAX_FEATURES = 0.5
CONSTRAINT_FOLDS = 5
CONSTRAINT_TREES = 30


def matrix(records: Sequence[Record], names: Sequence[str]) -> FloatArray:
    return np.asarray([features(r, names) for r in records], dtype=np.float64)


@dataclass
class TrainResult:
    names: list[str]
    regressor: str  # "forest" or "linear"
    forest: RandomForestRegressor | None
    linear: LinearModel | None
    constraints: list[int]
    cv: dict[str, Any]
    calibration: dict[str, Any] = field(default_factory=dict)
    predictive: dict[str, Any] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)
    constraint_checks: dict[str, Any] = field(default_factory=dict)
    curve: dict[str, list[float]] = field(default_factory=dict)

    @property
    def selected(self) -> str:
        return self.regressor


@dataclass
class OutOfFamily:
    """Each record's prediction and doubt from a model that never saw its family, and the
    fold it was held out in."""

    mean: FloatArray
    spread: FloatArray
    fold: np.ndarray[Any, np.dtype[np.int64]]
    fold_mean: FloatArray


def forest_for(
    trees: int, seed: int, constraints: Sequence[int] | None = None
) -> RandomForestRegressor:
    return RandomForestRegressor(
        n_estimators=trees,
        min_samples_leaf=2,
        max_features=MAX_FEATURES,
        random_state=seed,
        monotonic_cst=list(constraints) if constraints is not None else None,
        n_jobs=1,
    )


def train(
    records: Sequence[Record],
    *,
    folds: int = 0,
    trees: int = 100,
    seed: int = 0,
    coverage: float = cal.DEFAULT_COVERAGE,
    gate_precision: float = operating.DEFAULT_PRECISION,
    check_constraints: bool = True,
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
    constraints = [monotonic(n) for n in names]
    checks: dict[str, Any] = {}
    if check_constraints:
        constraints, checks = choose_constraints(x, y, groups, names, trees, seed)
    candidates = {
        "forest": forest_out_of_family(x, y, groups, splits, trees, seed, constraints),
        "linear": linear_out_of_family(x, y, groups, splits),
    }
    cv: dict[str, Any] = {name: scores(y, c.mean) for name, c in candidates.items()}
    mean_fit = candidates["forest"].fold_mean
    cv["mean"] = scores(y, mean_fit)
    winner = min(candidates, key=lambda name: cv[name]["mae"])
    _refuse_without_signal(cv, winner)
    chosen = candidates[winner]
    cv["folds"] = fold_figures(y, chosen)
    eps = cal.eps_of(chosen.spread)
    achieved, bounds = cal.grouped_coverage(y, chosen.mean, chosen.spread, groups, eps)
    conformity = cal.conformity(y, chosen.mean, chosen.spread, eps)
    calibration = cal.table(conformity, chosen.mean, eps, coverage)
    predictive = {
        "method": "conformal predictive distribution of out-of-family scores",
        "eps": eps,
        "levels": list(operating.CDF_LEVELS),
        "q": operating.cdf_quantiles(conformity),
    }
    by_floor = operating.p_keep_by_floor(y, chosen.mean, chosen.spread, eps)
    points = {**operating.operating_points(y, by_floor, groups), "precision": gate_precision}
    at = cal.LEVELS.index(coverage)
    cv["selected"] = {
        "regressor": winner,
        **cv[winner],
        **gate_figures(points, gate_precision),
        "lower": gate(y, bounds[:, at]),
        "coverage_nominal": coverage,
        "coverage_achieved": achieved[at],
    }
    cv.update(baselines(labelled, y, gate_precision))
    forest, linear = fit_winner(winner, x, y, names, trees, seed, constraints)
    curve = {"nominal": list(cal.LEVELS), "achieved": achieved}
    return TrainResult(
        names,
        winner,
        forest,
        linear,
        constraints,
        cv,
        calibration,
        predictive,
        points,
        checks,
        curve,
    )


def _refuse_without_signal(cv: dict[str, Any], winner: str) -> None:
    if cv[winner]["mae"] < cv["mean"]["mae"] * (1 - SIGNAL_MARGIN):
        return
    raise ValidationError(
        "data",
        f"neither the forest (MAE {cv['forest']['mae']:.4f}) nor the linear model (MAE "
        f"{cv['linear']['mae']:.4f}) beats the training mean (MAE {cv['mean']['mae']:.4f}) by "
        f"{SIGNAL_MARGIN:.0%} on held-out workload families: these records do not carry what "
        "their retention depends on (add counters, or records of more families)",
    )


def gate_figures(points: dict[str, Any], precision: float) -> dict[str, Any]:
    """The operating point's threshold, precision and recall at each of ``GATE_FLOORS``, in
    grouped CV and on families its threshold never saw."""
    result: dict[str, Any] = {"gate_precision_target": precision}
    for floor in GATE_FLOORS:
        result[f"gate_threshold_at_{floor}"] = operating.at(points, "threshold", floor, precision)
        for key in ("cv_precision", "cv_recall", "heldout_precision", "heldout_recall"):
            result[f"gate_{key}_at_{floor}"] = operating.at(points, key, floor, precision)
        # the wanted precision's own column: its held-out figures did not choose it
        for key in ("heldout_precision", "heldout_recall"):
            result[f"gate_{key}_own_column_at_{floor}"] = operating.at(
                points, key, floor, precision, chosen=False
            )
        precisions = list(points["precisions"])
        row = list(points["floors"]).index(floor)
        result[f"gate_column_at_{floor}"] = precisions[operating.column_for(points, row, precision)]
    return result


def fold_figures(y: FloatArray, chosen: OutOfFamily) -> dict[str, float]:
    """MAE of the estimate over the training mean's, in each held-out fold."""
    ratios = []
    for fold in np.unique(chosen.fold):
        inside = chosen.fold == fold
        model_mae = float(np.mean(np.abs(y[inside] - chosen.mean[inside])))
        mean_mae = float(np.mean(np.abs(y[inside] - chosen.fold_mean[inside])))
        ratios.append(model_mae / mean_mae if mean_mae > 0 else (0.0 if model_mae == 0 else 9.9))
    return {
        "count": float(len(ratios)),
        "beating_mean": float(sum(r < 1.0 for r in ratios)),
        "worst_mae_ratio": max(ratios),
        "median_mae_ratio": float(np.median(ratios)),
    }


def _splitter(groups: Sequence[str], splits: int) -> Any:
    return GroupKFold(n_splits=max(2, min(splits, len(set(groups)))))


def _empty(y: FloatArray) -> OutOfFamily:
    return OutOfFamily(
        np.zeros_like(y), np.zeros_like(y), np.zeros(y.size, np.int64), np.zeros_like(y)
    )


def forest_out_of_family(
    x: FloatArray,
    y: FloatArray,
    groups: Sequence[str],
    splits: int,
    trees: int,
    seed: int,
    constraints: Sequence[int],
) -> OutOfFamily:
    result = _empty(y)
    for fold, (train_idx, test_idx) in enumerate(_splitter(groups, splits).split(x, y, groups)):
        forest = forest_for(trees, seed, constraints).fit(x[train_idx], y[train_idx])
        per_tree = CompiledForest.from_sklearn(forest).tree_predictions(x[test_idx])
        result.mean[test_idx] = per_tree.mean(axis=1)
        result.spread[test_idx] = per_tree.std(axis=1)
        result.fold[test_idx] = fold
        result.fold_mean[test_idx] = y[train_idx].mean()
    return result


def linear_out_of_family(
    x: FloatArray, y: FloatArray, groups: Sequence[str], splits: int
) -> OutOfFamily:
    result = _empty(y)
    for fold, (train_idx, test_idx) in enumerate(_splitter(groups, splits).split(x, y, groups)):
        line = LinearModel.fit(x[train_idx], y[train_idx])
        result.mean[test_idx] = line.predict(x[test_idx])
        result.fold[test_idx] = fold
        result.fold_mean[test_idx] = y[train_idx].mean()
    return result


def constraint_group(name: str) -> str | None:
    """The resource a monotonic constraint is about (None: the feature has none)."""
    if monotonic(name) == 0:
        return None
    if name == "x.headroom":
        return "headroom"
    if name == "p.count":
        return "count"
    if "thread" in name:
        return "threads"
    if name.startswith("x.mem_") or name == "p.memory_frac_sum" or "fb_used" in name:
        return "memory"
    if any(key in name for key in ("dram", "l2", "memsys", "mem_util")):
        return "memory_system"
    return "compute"


def choose_constraints(
    x: FloatArray, y: FloatArray, groups: Sequence[str], names: Sequence[str], trees: int, seed: int
) -> tuple[list[int], dict[str, Any]]:
    """The monotonic constraints that hold in these records, by backward elimination: each
    round fits without each remaining group in turn and drops the one whose removal lowers
    the grouped-CV error most, if by more than ``CONSTRAINT_TOLERANCE``; it stops when none
    does (groups cost nothing alone and everything together, so one at a time)."""
    full = [monotonic(n) for n in names]
    by_group: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        group = constraint_group(name)
        if group is not None:
            by_group.setdefault(group, []).append(i)
    small = min(trees, CONSTRAINT_TREES)

    def without(dropped: set[str]) -> list[int]:
        off = {i for g in dropped for i in by_group[g]}
        return [0 if i in off else c for i, c in enumerate(full)]

    def mae(dropped: set[str]) -> float:
        oof = forest_out_of_family(x, y, groups, CONSTRAINT_FOLDS, small, seed, without(dropped))
        return float(np.mean(np.abs(y - oof.mean)))

    dropped: set[str] = set()
    current = mae(dropped)
    checks: dict[str, Any] = {"mae_all": current}
    while len(dropped) < len(by_group):
        trials = {g: mae(dropped | {g}) for g in sorted(set(by_group) - dropped)}
        for group, error in trials.items():
            checks[group] = {
                "kept": True,
                "features": len(by_group[group]),
                "mae_without": error,  # with the groups dropped before this round
                "round": len(dropped) + 1,
            }
        best = min(trials, key=lambda g: trials[g])
        if trials[best] >= current * (1 - CONSTRAINT_TOLERANCE):
            break
        dropped.add(best)
        current = trials[best]
        checks[best]["kept"] = False
    checks["mae_kept"] = current
    return without(dropped), checks


def fit_winner(
    winner: str,
    x: FloatArray,
    y: FloatArray,
    names: Sequence[str],
    trees: int,
    seed: int,
    constraints: Sequence[int],
) -> tuple[RandomForestRegressor | None, LinearModel | None]:
    if winner == "linear":
        return None, LinearModel.fit(x, y)
    return forest_for(trees, seed, constraints).fit(x, y), None


def data_hash(lines: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode())
    return digest.hexdigest()


def save(
    result: TrainResult,
    out: Path,
    *,
    data_sha256: str,
    records: int,
    provenance: str,
    extra: dict[str, Any] | None = None,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if result.forest is not None:
        CompiledForest.from_sklearn(result.forest).save(out / "forest.npz")
    metadata = {
        "schema_version": 3,
        "feature_version": FEATURE_VERSION,
        "features": result.names,
        "monotonic": list(result.constraints),
        "constraint_checks": result.constraint_checks,
        "regressor": result.regressor,
        "data_sha256": data_sha256,
        "records": records,
        "provenance": provenance,
        "calibration": result.calibration,
        "predictive": result.predictive,
        "gate": result.gate,
        "cross_validation": result.cv,
        "coverage_curve": result.curve,
        "versions": {
            "python": platform.python_version(),
            "scikit-learn": sklearn.__version__,
            "numpy": np.__version__,
        },
        **(extra or {}),
    }
    if result.forest is not None:
        metadata["trees"] = len(result.forest.estimators_)
    if result.linear is not None:
        metadata["linear"] = result.linear.to_json()
    (out / "model.json").write_text(json.dumps(metadata, indent=2) + "\n")
