"""Training the retention estimator (scikit-learn lives here, in ``crossval`` and in
``constraints``, and in no hot path).

Cross-validation is grouped by workload *family* (``family_of``: resnet50-bs32 and
resnet50-bs64 are one family; ``crossval``), so every reported figure is for families the
model never saw; ``folds=0`` holds out one family at a time. Training:

1. **Checks each monotonic constraint** (``features.monotonic``: more peer demand never
   raises the target's retention), one resource at a time, by backward elimination
   (``constraints``): a group whose removal lowers the grouped-CV error by more than
   ``constraints.CONSTRAINT_TOLERANCE`` does not hold in these records and is dropped.
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

from agent.core.errors import ValidationError
from agent.estimator import calibration as cal
from agent.estimator import operating
from agent.estimator.compiled import CompiledForest
from agent.estimator.constraints import choose_constraints
from agent.estimator.crossval import (
    fold_figures,
    forest_for,
    forest_out_of_family,
    linear_out_of_family,
)
from agent.estimator.evaluation import GATE_FLOORS, baselines, gate, scores
from agent.estimator.features import (
    FEATURE_VERSION,
    counter_names,
    feature_names,
    features,
    monotonic,
)
from agent.estimator.linear import LinearModel
from agent.estimator.records import BASES, Record, family_of

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
SIGNAL_MARGIN = 0.05  # an estimate must beat the training mean's MAE by this much (relative)


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
    cv["retention_bases"] = {
        basis: sum(r.retention_basis == basis for r in labelled) for basis in BASES
    }
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
