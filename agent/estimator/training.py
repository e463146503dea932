"""Training the retention estimator (scikit-learn lives here, in ``crossval``, ``transfer``
and ``constraints``, and in no hot path).

Cross-validation is grouped by workload *family* (``family_of``: resnet50-bs32 and
resnet50-bs64 are one family; ``crossval``), and families that are each other's nearest
are held out together (``transfer.like_groups``), so every reported figure is for families
the model never saw, without a near twin to vouch for them; ``folds=0`` holds out one
such group at a time. Training:

1. **Checks each monotonic constraint** (``features.monotonic``: more peer demand never
   raises the target's retention), one resource at a time, by backward elimination
   (``constraints``): a group whose removal lowers the grouped-CV error by more than
   ``constraints.CONSTRAINT_TOLERANCE`` does not hold in these records and is dropped.
2. **Picks the estimate** ``predicted_retention`` is: the Random Forest, a ridge line
   (``linear``) or the monotone base of aggregate pressure (``pressure``), whichever has the
   lowest out-of-family MAE. A dataset on which none beats the training mean (by
   ``SIGNAL_MARGIN``) is refused, with the figures.
3. **Calibrates** ``retention_lower`` from that estimate's out-of-family residuals
   (``calibration``).
4. **Chooses what the gate decides on** (``selection``): each one-line rule, the base, the
   base plus a share of the forest's correction (``structure``, ``transfer``) or the
   estimate itself, by what kept the wanted precision on held-out families at floor
   ``CHOICE_FLOOR``; where it is not the estimate, it is stored beside it (``decision``).
5. **Chooses the gate's operating point** from the decided estimate's out-of-family scores:
   the predictive distribution behind P(retention >= floor) (``operating``) and, for every
   floor and precision, the threshold with the most recall at that precision and the
   precision it keeps on families its threshold never saw.
6. **Scores the baselines that apply** (``evaluation.baselines``: the utilisation-sum rules
   only when the records carry ``gpu_util``) on the same records.
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
    OutOfFamily,
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
from agent.estimator.selection import Candidate, Choice, choose
from agent.estimator.structure import CORRECTION_FILE, Structure
from agent.estimator.transfer import (
    Parts,
    fit_structure,
    gate_candidates,
    like_groups,
    mode_of,
    out_of_family,
)

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
SIGNAL_MARGIN = 0.05  # an estimate must beat the training mean's MAE by this much (relative)
CHOICE_FLOOR = 0.85  # the floor the gate's estimate is chosen at


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
    structure: Structure | None = None  # the estimate, where only the base carries signal
    decision: Structure | None = None  # what the gate decides on, where not the estimate
    correction: RandomForestRegressor | None = None  # the decision's forest, as fitted
    prepared: Prepared | None = None  # what the choice was made from (in memory only)

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
    coverage = round(coverage, 2)  # one of the stored levels
    if not cal.LEVELS[0] <= coverage <= cal.LEVELS[-1]:
        raise ValidationError("coverage", f"must be within [0.5, 0.99] (got {coverage})")
    p = prepare(records, folds, trees, seed, check_constraints)
    y, cv, reported = p.y, p.cv, p.candidates[p.winner]
    options = p.options()
    choice = choose(
        list(options.values()),
        y,
        np.asarray(p.groups),
        np.asarray(p.alike),
        CHOICE_FLOOR,
        gate_precision,
    )
    cv["gate_choice"] = choice_figures(choice)
    picked = options[choice.name]
    cv["folds"] = fold_figures(y, reported)
    eps = cal.eps_of(reported.spread)
    achieved, bounds = cal.grouped_coverage(y, reported.mean, reported.spread, p.groups, eps)
    conformity = cal.conformity(y, reported.mean, reported.spread, eps)
    calibration = cal.table(conformity, reported.mean, eps, coverage)
    points, predictive = _operating_point(y, picked.mean, picked.spread, p.alike, gate_precision)
    regressor = p.winner if p.winner != "base" else "structure"
    cv["selected"] = {
        "regressor": regressor,
        "estimate": choice.name,
        **cv[p.winner],
        **gate_figures(points, gate_precision),
        "lower": gate(y, bounds[:, cal.LEVELS.index(coverage)]),
        "coverage_nominal": coverage,
        "coverage_achieved": achieved[cal.LEVELS.index(coverage)],
    }
    cv.update(baselines(p.labelled, y, gate_precision))
    result = TrainResult(
        p.names, regressor, None, None, p.constraints, cv, calibration, predictive, points
    )
    result.constraint_checks = p.checks
    result.prepared = p
    result.curve = {"nominal": list(cal.LEVELS), "achieved": achieved}
    _fit_final(result, p, choice.name, trees, seed)
    return result


def _fit_final(result: TrainResult, p: Prepared, chosen: str, trees: int, seed: int) -> None:
    """The reported estimate and, where the gate decides on another, that one, each fitted
    on every record."""
    x, y, names, constraints = p.x, p.y, p.names, p.constraints
    if p.winner == "base":
        result.structure, _ = fit_structure("base", 0.0, p.parts, x, y, names, 0, seed, [])
    else:
        result.forest, result.linear = fit_winner(p.winner, x, y, names, trees, seed, constraints)
    if chosen != p.winner:  # the gate decides on another estimate than the one reported
        mode, share = mode_of(chosen)
        result.decision, result.correction = fit_structure(
            mode, share, p.parts, x, y, names, trees, seed, constraints
        )


@dataclass
class Prepared:
    """What training and the nested study share: the records as a matrix, the families
    and the groups of like families held out together, every out-of-family estimate, and
    the reported estimate (``winner``: the forest, the line or, where only it carries
    signal, the base)."""

    labelled: list[Record]
    names: list[str]
    x: FloatArray
    y: FloatArray
    groups: list[str]
    alike: list[str]
    constraints: list[int]
    checks: dict[str, Any]
    parts: Parts
    candidates: dict[str, OutOfFamily]
    cv: dict[str, Any]
    winner: str

    def options(self) -> dict[str, Candidate]:
        """Every estimate the gate could decide on (``transfer.gate_candidates``)."""
        found = gate_candidates(self.parts, self.winner, self.candidates[self.winner])
        return {c.name: c for c in found}


def prepare(
    records: Sequence[Record], folds: int, trees: int, seed: int, check_constraints: bool
) -> Prepared:
    labelled = [r for r in records if r.retention is not None]
    groups = [family_of(r.target) for r in labelled]
    families = len(set(groups))
    if families < 2:
        raise ValidationError("data", "training needs records of at least two workload families")
    names = feature_names(counter_names(labelled)[0])
    x = matrix(labelled, names)
    y = np.asarray([r.retention for r in labelled], dtype=np.float64)
    constraints = [monotonic(n) for n in names]
    checks: dict[str, Any] = {}
    if check_constraints:
        constraints, checks = choose_constraints(x, y, groups, names, trees, seed)
    alike = like_groups(x, y, groups, names, trees, seed, constraints)
    splits = min(folds if folds > 0 else families, len(set(alike)))
    candidates = {
        "forest": forest_out_of_family(x, y, alike, splits, trees, seed, constraints),
        "linear": linear_out_of_family(x, y, alike, splits),
    }
    parts = out_of_family(x, y, alike, splits, names, trees, seed, constraints)
    cv: dict[str, Any] = {name: scores(y, c.mean) for name, c in candidates.items()}
    cv["base"] = scores(y, parts.base)
    cv["retention_bases"] = {
        basis: sum(r.retention_basis == basis for r in labelled) for basis in BASES
    }
    cv["mean"] = scores(y, candidates["forest"].fold_mean)
    winner = min(("forest", "linear", "base"), key=lambda name: cv[name]["mae"])
    _refuse_without_signal(cv, winner)
    zeros = np.zeros_like(y)
    fold, fold_mean = candidates["forest"].fold, candidates["forest"].fold_mean
    candidates["base"] = OutOfFamily(parts.base, zeros, fold, fold_mean)
    return Prepared(
        labelled, names, x, y, groups, alike, constraints, checks, parts, candidates, cv, winner
    )


def _operating_point(
    y: FloatArray, mean: FloatArray, spread: FloatArray, groups: Sequence[str], precision: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gate's thresholds on P(retention >= floor) and the predictive distribution behind
    it, both from the gate's own estimate's out-of-family scores."""
    eps = cal.eps_of(spread)
    by_floor = operating.p_keep_by_floor(y, mean, spread, eps)
    points = {**operating.operating_points(y, by_floor, groups), "precision": precision}
    return points, _predictive(eps, cal.conformity(y, mean, spread, eps))


def _predictive(eps: float, conformity: FloatArray) -> dict[str, Any]:
    return {
        "method": "conformal predictive distribution of out-of-family scores",
        "eps": eps,
        "levels": list(operating.CDF_LEVELS),
        "q": operating.cdf_quantiles(conformity),
    }


def choice_figures(choice: Choice) -> dict[str, Any]:
    """What ``train`` prints and stores of the choice: the estimate, whether it reached the
    wanted precision held out, and every candidate's held-out figures."""
    best_rule = choice.best_rule()
    return {
        "estimate": choice.name,
        "reached": choice.reached,
        "reason": choice.reason,
        "floor": CHOICE_FLOOR,
        "best_rule": best_rule,
        "gate_heldout_recall": choice.judged[choice.name].recall,
        "gate_heldout_precision": choice.judged[choice.name].precision,
        "best_rule_heldout_recall": choice.judged[best_rule].recall if best_rule else None,
        "best_rule_heldout_precision": choice.judged[best_rule].precision if best_rule else None,
        "candidates": {name: j.to_json() for name, j in choice.judged.items()},
    }


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
    if result.decision is not None and result.decision.correction is not None:
        result.decision.correction.save(out / CORRECTION_FILE)
    metadata = {
        "schema_version": 4 if result.structure or result.decision else 3,
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
    if result.structure is not None:
        metadata["structure"] = result.structure.to_json()
    if result.decision is not None:
        metadata["decision"] = result.decision.to_json()
    (out / "model.json").write_text(json.dumps(metadata, indent=2) + "\n")
