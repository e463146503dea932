"""Fitting the transferring estimator (``structure``) and its out-of-family parts, one model
per held-out fold of groups of like workload families (``like_groups``). Scikit-learn
and scipy are used here (training only).

Per fold: the monotone base (``pressure``: non-negative least squares of the retention
lost on the present terms gives the index's weights, an isotonic regression the
non-increasing ``g``), the Random Forest on the base's residual (the same monotonic
constraints as the forest), each rule's isotonic on its term alone, and each held-out
record's distance to the fold's training workloads (``structure.Far``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import nnls  # type: ignore[import-untyped]
from sklearn.ensemble import RandomForestRegressor
from sklearn.isotonic import IsotonicRegression

from agent.estimator.compiled import CompiledForest
from agent.estimator.crossval import FloatArray, OutOfFamily, _splitter, forest_for
from agent.estimator.pressure import RULES, Monotone, present_terms, term_values
from agent.estimator.selection import SHRINKS, Candidate
from agent.estimator.structure import REACH, Far, Structure, combine

# families nearer than this share of the median distance between families are near twins
NEAR_TWIN = 0.1


@dataclass
class Parts:
    """Out-of-family parts of every record (see ``structure.parts``) and each rule's
    isotonic estimate."""

    terms: list[str]
    base: FloatArray
    correction: FloatArray
    weight: FloatArray
    trees: FloatArray
    typical: float
    base_doubt: float
    rules: dict[str, FloatArray] = field(default_factory=dict)


def fit_base(x: FloatArray, y: FloatArray, names: Sequence[str], terms: list[str]) -> Monotone:
    t = term_values(x, names, terms)
    weights, _ = nnls(np.column_stack([t, np.ones(len(y))]), 1.0 - y)
    w = weights[:-1] if weights[:-1].sum() > 0 else np.ones(len(terms))
    return _isotonic(t @ w, y, terms, np.asarray(w, dtype=np.float64))


def fit_rule(x: FloatArray, y: FloatArray, names: Sequence[str], term: str) -> Monotone:
    return _isotonic(term_values(x, names, [term])[:, 0], y, [term], np.ones(1))


def _isotonic(index: FloatArray, y: FloatArray, terms: list[str], w: FloatArray) -> Monotone:
    iso = IsotonicRegression(increasing=False, out_of_bounds="clip").fit(index, y)
    knots_x = np.asarray(iso.X_thresholds_, dtype=np.float64)
    knots_y = np.asarray(iso.y_thresholds_, dtype=np.float64)
    return Monotone(terms, w, knots_x, knots_y)


def fit_far(x: FloatArray, names: Sequence[str], forest: Any, typical: float = 0.0) -> Far:
    columns = [i for i, n in enumerate(names) if n.startswith("t.")]
    importance = np.asarray(forest.feature_importances_, dtype=np.float64)[columns]
    share = importance / importance.sum() if importance.sum() > 0 else np.ones(len(columns))
    center = x[:, columns].mean(axis=0)
    std = np.where(x[:, columns].std(axis=0) > 0, x[:, columns].std(axis=0), 1.0)
    scale = std / np.sqrt(np.maximum(share, 1e-12))
    rows = np.unique(np.round((x[:, columns] - center) / scale, 9), axis=0)
    return Far(columns, center, scale, rows, typical)


def residual_forest(
    x: FloatArray, y: FloatArray, base: FloatArray, trees: int, seed: int, constraints: Any
) -> RandomForestRegressor:
    return forest_for(trees, seed, constraints).fit(x, y - base)


def out_of_family(
    x: FloatArray,
    y: FloatArray,
    groups: Sequence[str],
    splits: int,
    names: Sequence[str],
    trees: int,
    seed: int,
    constraints: Sequence[int],
) -> Parts:
    terms = present_terms(x, names)
    rules = [t for t in RULES if t in terms]
    zeros = np.zeros_like(y)
    base, correction, trees_spread, distance = (zeros.copy() for _ in range(4))
    by_rule = {t: zeros.copy() for t in rules}
    for train_idx, test_idx in _splitter(groups, splits).split(x, y, groups):
        xt, yt, xh = x[train_idx], y[train_idx], x[test_idx]
        fitted = fit_base(xt, yt, names, terms)
        base[test_idx] = fitted.predict(xh, names)
        forest = residual_forest(xt, yt, fitted.predict(xt, names), trees, seed, constraints)
        per_tree = CompiledForest.from_sklearn(forest).tree_predictions(xh)
        correction[test_idx], trees_spread[test_idx] = per_tree.mean(axis=1), per_tree.std(axis=1)
        distance[test_idx] = fit_far(xt, names, forest).distance(xh)
        for term in rules:
            by_rule[term][test_idx] = fit_rule(xt, yt, names, term).predict(xh, names)
    typical = float(np.median(distance))
    weight = np.clip((REACH * max(typical, 1e-9) / np.maximum(distance, 1e-12)) ** 2, 0.0, 1.0)
    doubt = float(np.std(y - base))
    return Parts(terms, base, correction, weight, trees_spread, typical, doubt, by_rule)


def fit_structure(
    mode: str,
    shrink: float,
    parts: Parts,
    x: FloatArray,
    y: FloatArray,
    names: Sequence[str],
    trees: int,
    seed: int,
    constraints: Sequence[int],
) -> tuple[Structure, RandomForestRegressor | None]:
    """The chosen estimate fitted on every record (the forest too, for the exactness
    check of its compiled form)."""
    if mode.startswith("rule:"):
        term = mode.split(":", 1)[1]
        return Structure(mode, list(names), fit_rule(x, y, names, term)), None
    base = fit_base(x, y, names, parts.terms)
    if mode == "base" or shrink == 0.0:
        return Structure("base", list(names), base), None
    forest = residual_forest(x, y, base.predict(x, names), trees, seed, constraints)
    far = fit_far(x, names, forest, parts.typical)
    compiled = CompiledForest.from_sklearn(forest)
    return Structure(mode, list(names), base, compiled, shrink, far, parts.base_doubt), forest


def gate_candidates(parts: Parts, estimate: str, own: OutOfFamily) -> list[Candidate]:
    """Every estimate the gate could decide on, simplest first (``selection``): each rule,
    the base, the base plus a share of the correction (as a point, and with the trees'
    spread), and ``estimate`` (the model's reported estimate, ``own`` its out-of-family
    predictions) where it is none of those."""
    zeros = np.zeros_like(parts.base)
    found = [Candidate(f"rule:{t}", m, zeros, 0) for t, m in parts.rules.items()]
    found.append(Candidate("base", parts.base, zeros, 1))
    as_parts = {
        "base": parts.base,
        "correction": parts.correction,
        "weight": parts.weight,
        "trees": parts.trees,
    }
    for at, shrink in enumerate(SHRINKS):
        mean, spread = combine(as_parts, shrink, False, parts.base_doubt, True)
        found.append(Candidate(f"corrected@{shrink}", mean, spread, 2 + at))
    mean, spread = combine(as_parts, 1.0, True, parts.base_doubt, True)
    found.append(Candidate("corrected_p_keep@1.0", mean, spread, 2 + len(SHRINKS)))
    if estimate != "base":
        found.append(Candidate(estimate, own.mean, own.spread, 3 + len(SHRINKS)))
    return found


def mode_of(name: str) -> tuple[str, float]:
    """A candidate's name as the structure's mode and share of the correction."""
    if "@" in name:
        mode, share = name.split("@", 1)
        return mode, float(share)
    return name, 0.0


def refit(
    structure: Structure,
    x: FloatArray,
    y: FloatArray,
    trees: int,
    seed: int,
    constraints: Sequence[int],
) -> Structure:
    """The same choice (mode, share, reach, the base's doubt) fitted on other records."""
    typical = structure.far.typical if structure.far is not None else 0.0
    parts = Parts(structure.base.terms, y, y, y, y, typical, structure.base_doubt)
    fitted, _forest = fit_structure(
        structure.mode, structure.shrink, parts, x, y, structure.names, trees, seed, constraints
    )
    return fitted


def like_groups(
    x: FloatArray,
    y: FloatArray,
    groups: Sequence[str],
    names: Sequence[str],
    trees: int,
    seed: int,
    constraints: Sequence[int],
) -> list[str]:
    """Near twins held out together, so that a twin cannot vouch for a family: a family
    joins the one nearest it (the families' mean target counters, each in its standard
    deviations weighted by its share of the correction's importance) where that one is
    closer than ``NEAR_TWIN`` of the median distance between families, and a group is a
    connected set of such links. Families with no such twin stay alone: grouping families
    that are merely alike holds out more than a new family takes away, and leaves the
    threshold to few groups."""
    labels = sorted(set(groups))
    if len(labels) < 4:
        return list(groups)
    base = fit_base(x, y, names, present_terms(x, names))
    forest = residual_forest(x, y, base.predict(x, names), min(trees, 30), seed, constraints)
    far = fit_far(x, names, forest)
    at = np.asarray(groups)
    spread = np.std(x[:, far.columns], axis=0).clip(1e-12)
    z = (x[:, far.columns] - far.center) / far.scale**2 * spread
    centroids = np.asarray([z[at == label].mean(axis=0) for label in labels])
    gaps = np.sqrt(((centroids[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2))
    np.fill_diagonal(gaps, np.inf)
    root = list(range(len(labels)))

    def find(i: int) -> int:
        while root[i] != i:
            i = root[i]
        return i

    typical = float(np.median(gaps[np.isfinite(gaps)]))
    for i, j in enumerate(np.argmin(gaps, axis=1)):
        if gaps[i, j] <= NEAR_TWIN * typical:
            root[find(i)] = find(int(j))
    cluster = [find(i) for i in range(len(labels))]
    if len(set(cluster)) < 2:  # one group: nothing to hold out apart
        return list(groups)
    name = {label: f"like-{c}" for label, c in zip(labels, cluster, strict=True)}
    return [name[g] for g in groups]
