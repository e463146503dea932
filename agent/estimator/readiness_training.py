"""Train and evaluate the readiness predictor (scikit-learn, off the agent's hot path).

A RandomForestClassifier over the nine attributes, compiled to flat arrays for the agent
(``ReadinessModel``). Evaluation is K-fold grouped by machine: no machine is in both the
training and the held-out part of a fold, so the figures say how the predictor does on
machines it has not seen. Each fold scores the predictor and the two lookup baselines by
ROC-AUC, PR-AUC (average precision) and expected calibration error (10 equal-width bins).
"""

from __future__ import annotations

import hashlib
import platform
from typing import Any

import numpy as np
import sklearn
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import GroupKFold, KFold

from agent.core.errors import ValidationError
from agent.estimator.compiled import CompiledForest
from agent.estimator.readiness import (
    READINESS_FEATURE_VERSION,
    LookupRule,
    ReadinessModel,
    ece,
    encode,
    feature_names,
    pr_auc,
    roc_auc,
    vocabulary,
)
from agent.estimator.readiness_data import Dataset

RULES = ("model-x-job", "job-x-duration")


def _forest(trees: int, seed: int) -> RandomForestClassifier:
    return RandomForestClassifier(
        n_estimators=trees, min_samples_leaf=20, max_features=0.5, n_jobs=1, random_state=seed
    )


MIN_ROWS = 50


def require_enough(data: Dataset) -> None:
    """Refuse data a forest cannot learn from: too few rows, or one outcome only."""
    if len(data) < MIN_ROWS or all(data.labels) or not any(data.labels):
        raise ValidationError(
            "data",
            f"need at least {MIN_ROWS} rows with both outcomes (ready and never ready); "
            f"got {len(data)} ({sum(data.labels)} ready)",
        )


def train(data: Dataset, *, trees: int = 60, seed: int = 0, provenance: str) -> ReadinessModel:
    labels = np.asarray(data.labels, dtype=bool)
    require_enough(data)
    vocab = vocabulary(data.rows)
    forest = _forest(trees, seed).fit(encode(data.rows, vocab), labels)
    column = list(forest.classes_).index(True)
    digest = hashlib.sha256(repr((data.rows, data.labels)).encode()).hexdigest()
    metadata: dict[str, Any] = {
        "schema_version": 1,
        "feature_version": READINESS_FEATURE_VERSION,
        "features": feature_names(vocab),
        "trees": trees,
        "seed": seed,
        "rows": len(data),
        "ready_share": float(labels.mean()),
        "provenance": provenance,
        "data_sha256": digest,
        "sklearn": sklearn.__version__,
        "python": platform.python_version(),
    }
    return ReadinessModel(CompiledForest.from_sklearn(forest, value_column=column), vocab, metadata)


def evaluate(data: Dataset, *, folds: int = 5, trees: int = 60, seed: int = 0) -> dict[str, Any]:
    """Per-method means (and per-fold values) of ROC-AUC, PR-AUC and ECE on held-out folds."""
    require_enough(data)
    labels = np.asarray(data.labels, dtype=bool)
    machines = len(set(data.groups))
    grouped = machines >= folds
    splitter = (
        GroupKFold(n_splits=folds) if grouped else KFold(folds, shuffle=True, random_state=seed)
    )
    scores: dict[str, list[dict[str, float]]] = {m: [] for m in ("predictor", *RULES)}
    indices = np.arange(len(data))
    groups = data.groups if grouped else None  # KFold ignores groups, and warns
    for train_at, test_at in splitter.split(indices, labels, groups=groups):
        part = Dataset(
            [data.rows[i] for i in train_at],
            [data.labels[i] for i in train_at],
            [data.groups[i] for i in train_at],
        )
        held = [data.rows[i] for i in test_at]
        truth = labels[test_at]
        predicted = {
            "predictor": train(part, trees=trees, seed=seed, provenance="fold").predict(held)
        }
        for rule in RULES:
            predicted[rule] = LookupRule.fit(rule, part.rows, part.labels).predict(held)
        for method, p in predicted.items():
            scores[method].append(
                {"roc_auc": roc_auc(truth, p), "pr_auc": pr_auc(truth, p), "ece": ece(truth, p)}
            )
    summary = {
        method: {k: float(np.nanmean([f[k] for f in folds_])) for k in ("roc_auc", "pr_auc", "ece")}
        for method, folds_ in scores.items()
    }
    return {
        "rows": len(data),
        "machines": machines,
        "folds": folds,
        "grouped_by_machine": grouped,
        "ready_share": float(labels.mean()),
        "methods": summary,
        "per_fold": scores,
    }
