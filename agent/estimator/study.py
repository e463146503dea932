"""The gate judged in nested cross-validation over groups of like workload families: what
``bench/estimator.py --gate`` prints and the never-dominated tests assert.

Outer loop: the groups of like families (``transfer.like_groups``, near twins together) are
held out in turn (``OUTER_FOLDS`` folds of groups at most). For each, ``train`` runs on the
other records alone, as an operator would run it, its own choice of estimate and operating
point made in its own grouped cross-validation (``inner`` folds); the model is saved,
loaded and asked about the held-out records through the gate's own path
(``RetentionModel.admits``). Each applicable one-line rule and the monotone base are scored
the same way: fitted on the other records, their limits chosen on those records'
out-of-family estimates (``selection.robust_threshold``). Nothing of a held-out group, its
labels or its records, reaches what judges it; only the grouping into folds is drawn over all
the records (their counters, weighted by a forest fitted on every record's retention), so
that near twins fall into one fold.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import GroupKFold

from agent.estimator.features import counter_names, feature_names, monotonic
from agent.estimator.model import RetentionModel
from agent.estimator.operating import DEFAULT_PRECISION
from agent.estimator.records import Record, family_of
from agent.estimator.selection import Candidate, judge, robust_threshold
from agent.estimator.training import CHOICE_FLOOR, Prepared, matrix, save, train
from agent.estimator.transfer import fit_base, fit_rule, like_groups

OUTER_FOLDS = 8  # folds of groups held out in turn (each group alone where there are fewer)
INNER_FOLDS = 5  # the inner training's own grouped folds

Table = dict[str, tuple[int, int, int]]  # family -> (good admitted, bad admitted, good)


def nested_gate(
    records: Sequence[Record],
    *,
    trees: int = 40,
    seed: int = 0,
    floor: float = CHOICE_FLOOR,
    precision: float = DEFAULT_PRECISION,
    outer: int = OUTER_FOLDS,
    inner: int = INNER_FOLDS,
) -> dict[str, Any]:
    """Held-out precision, recall and worst fifth of families' precision of the gate, of
    each applicable rule (``rule:<term>``) and of the base; ``picked``: what the gate
    decided on per outer fold; ``short_folds``: how many of them found nothing that kept the
    precision held out in training; ``best_rule``: the rule with the most held-out recall among
    those keeping the precision (within 0.01)."""
    labelled = [r for r in records if r.retention is not None]
    families = np.asarray([family_of(r.target) for r in labelled])
    alike = np.asarray(_like_groups(labelled, families, trees, seed))
    tables: dict[str, Table] = {"gate": {}, "base": {}}
    picked: dict[str, int] = {}
    short = 0  # outer folds whose training found nothing keeping the precision held out
    for held in _outer_folds(alike, outer):
        seen = [r for r, h in zip(labelled, held, strict=True) if not h]
        asked = [r for r, h in zip(labelled, held, strict=True) if h]
        result = train(
            seen,
            folds=inner,
            trees=trees,
            seed=seed,
            gate_precision=precision,
            check_constraints=False,
        )
        name = str(result.cv["gate_choice"]["estimate"])
        picked[name] = picked.get(name, 0) + 1
        short += not result.cv["gate_choice"]["reached"]
        truth = np.asarray([r.retention for r in asked], dtype=np.float64)
        asked_families = families[held]
        _count(
            tables["gate"],
            _gate_admits(result, seen, asked, floor, precision),
            truth >= floor,
            asked_families,
        )
        assert result.prepared is not None
        for key, admitted in _simple_admits(result.prepared, asked, floor, precision).items():
            _count(tables.setdefault(key, {}), admitted, truth >= floor, asked_families)
    figures: dict[str, Any] = {key: judge(table).to_json() for key, table in tables.items()}
    figures["picked"] = picked
    figures["short_folds"] = short
    figures["best_rule"] = _best_rule(figures, precision)
    figures["groups"] = len(set(alike))
    figures["families"] = len(set(families))
    return figures


def _like_groups(labelled: list[Record], families: Any, trees: int, seed: int) -> list[str]:
    names = feature_names(counter_names(labelled)[0])
    x = matrix(labelled, names)
    y = np.asarray([r.retention for r in labelled], dtype=np.float64)
    constraints = [monotonic(n) for n in names]
    return like_groups(x, y, [str(f) for f in families], names, trees, seed, constraints)


def _outer_folds(alike: Any, outer: int) -> list[Any]:
    """Boolean masks of the records held out in each outer fold: each group of like
    families alone, or ``outer`` folds of whole groups where there are more groups."""
    labels = sorted(set(alike.tolist()))
    if len(labels) <= outer:
        return [alike == label for label in labels]
    index = np.arange(alike.size)
    splitter = GroupKFold(n_splits=outer)
    return [np.isin(index, test) for _train, test in splitter.split(index, groups=alike)]


def _gate_admits(
    result: Any, seen: list[Record], asked: list[Record], floor: float, precision: float
) -> Any:
    """The gate's decisions on ``asked`` from the model as ``train`` saves it, loaded."""
    with tempfile.TemporaryDirectory() as folder:
        save(result, Path(folder), data_sha256="nested", records=len(seen), provenance="nested")
        model = RetentionModel.load(Path(folder))
    _p, admitted = model.admits(model.estimate(asked), floor, precision)
    return admitted


def _simple_admits(
    p: Prepared, asked: list[Record], floor: float, precision: float
) -> dict[str, Any]:
    """Each applicable rule's and the base's decisions on ``asked``: fitted on the training
    records, the limit chosen on their out-of-family estimates."""
    options = p.options()
    good = p.y >= floor
    x_asked = matrix(asked, p.names)
    found = {}
    for name, option in options.items():
        if not (name == "base" or option.rule):
            continue
        threshold = robust_threshold(
            option.score(floor), good, np.asarray(p.groups), np.asarray(p.alike), precision
        )
        fitted = (
            fit_base(p.x, p.y, p.names, p.parts.terms)
            if name == "base"
            else fit_rule(p.x, p.y, p.names, name.split(":", 1)[1])
        )
        mean = fitted.predict(x_asked, p.names)
        score = Candidate(name, mean, np.zeros_like(mean), 0).score(floor)
        found[name] = score >= threshold if threshold is not None else np.zeros(len(asked), bool)
    return found


def _count(table: Table, admitted: Any, good: Any, families: Any) -> None:
    for family in np.unique(families):
        at = families == family
        g = good[at]
        table[str(family)] = (
            int((admitted[at] & g).sum()),
            int((admitted[at] & ~g).sum()),
            int(g.sum()),
        )


def _best_rule(figures: dict[str, Any], precision: float) -> str | None:
    rules = [n for n in figures if n.startswith("rule:")]
    kept = [n for n in rules if (figures[n]["heldout_precision"] or 0.0) >= precision - 0.01]
    return max(kept or rules, key=lambda n: figures[n]["heldout_recall"], default=None)
