"""The readiness predictor as the agent uses it: P(ready) from the nine admission-time
attributes, with a compiled forest (numpy only), plus the metrics and lookup baselines it
is judged against. Pure apart from ``load``.

Features: the four categorical attributes one-hot over the values seen in training (an
unseen value sets none of its columns), ``generative`` as 0/1, requested GPUs as is, and
declared duration, scheduling delay and concurrent requests as ``log1p``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.core.errors import ValidationError
from agent.core.lease import HISTORY_ATTRIBUTES
from agent.estimator.compiled import CompiledForest

READINESS_FEATURE_VERSION = 1
CATEGORICAL = ("accelerator_model", "priority", "job_type", "model_type")
LOGGED = ("declared_duration_s", "scheduling_delay_s", "concurrent_requests")
NUMERIC = ("generative", "requested_gpus", *LOGGED)
assert set(CATEGORICAL + NUMERIC) == set(HISTORY_ATTRIBUTES)
DEFAULT_READINESS_DIR = Path(__file__).with_name("default_readiness")

Row = Mapping[str, float | str]
FloatArray = npt.NDArray[np.float64]


def vocabulary(rows: Sequence[Row]) -> dict[str, list[str]]:
    """The values of each categorical attribute seen in ``rows``, sorted."""
    return {name: sorted({str(r.get(name, "")) for r in rows}) for name in CATEGORICAL}


def feature_names(vocab: Mapping[str, Sequence[str]]) -> list[str]:
    names = [f"{name}={value}" for name in CATEGORICAL for value in vocab[name]]
    return names + list(NUMERIC)


def encode(rows: Sequence[Row], vocab: Mapping[str, Sequence[str]]) -> FloatArray:
    """The feature matrix of ``rows`` (one row each), columns as ``feature_names``."""
    offsets: dict[str, dict[str, int]] = {}
    column = 0
    for name in CATEGORICAL:
        offsets[name] = {value: column + i for i, value in enumerate(vocab[name])}
        column += len(vocab[name])
    x = np.zeros((len(rows), column + len(NUMERIC)))
    for i, row in enumerate(rows):
        for name in CATEGORICAL:
            at = offsets[name].get(str(row.get(name, "")))
            if at is not None:
                x[i, at] = 1.0
        for j, name in enumerate(NUMERIC):
            value = float(row.get(name, 0.0) or 0.0)
            x[i, column + j] = math.log1p(max(value, 0.0)) if name in LOGGED else value
    return x


@dataclass(frozen=True)
class ReadinessModel:
    forest: CompiledForest
    vocab: dict[str, list[str]]
    metadata: dict[str, Any]

    @classmethod
    def load(cls, directory: Path) -> ReadinessModel:
        try:
            metadata = json.loads((directory / "model.json").read_text())
            forest = CompiledForest.load(directory / "forest.npz")
        except (OSError, ValueError, KeyError) as exc:
            raise ValidationError(
                "readiness model", f"cannot load a model from {directory}: {exc}"
            ) from exc
        if metadata.get("feature_version") != READINESS_FEATURE_VERSION:
            raise ValidationError(
                "readiness model",
                f"features are version {metadata.get('feature_version')}, this agent reads "
                f"{READINESS_FEATURE_VERSION}: retrain it",
            )
        return cls(forest, {k: list(v) for k, v in metadata["vocabulary"].items()}, metadata)

    def predict(self, rows: Sequence[Row]) -> FloatArray:
        """P(ready) for each row."""
        if not rows:
            return np.zeros(0)
        return self.forest.predict(encode(rows, self.vocab))

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.forest.save(directory / "forest.npz")
        body = {**self.metadata, "vocabulary": self.vocab}
        (directory / "model.json").write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


# -- metrics -------------------------------------------------------------------------------


def roc_auc(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Area under the ROC curve (the Mann-Whitney statistic, ties counted half)."""
    y = np.asarray(labels, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_scores = s[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(average, counts)
    return float((ranks[y].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def pr_auc(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Average precision: precision summed at each positive, highest scores first."""
    y = np.asarray(labels, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    if not y.any():
        return float("nan")
    order = np.argsort(-s, kind="mergesort")
    y_sorted = y[order]
    s_sorted = s[order]
    hits = np.cumsum(y_sorted)
    # evaluate at the last row of each group of tied scores
    last = np.r_[s_sorted[1:] != s_sorted[:-1], True]
    precision = hits[last] / (np.nonzero(last)[0] + 1)
    recall_gain = np.diff(np.r_[0, hits[last]]) / y.sum()
    return float((precision * recall_gain).sum())


def ece(labels: npt.ArrayLike, scores: npt.ArrayLike, *, bins: int = 10) -> float:
    """Expected calibration error over ``bins`` equal-width bins of the score."""
    y = np.asarray(labels, dtype=np.float64)
    s = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
    which = np.minimum((s * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        members = which == b
        if members.any():
            total += members.sum() * abs(s[members].mean() - y[members].mean())
    return float(total / max(len(y), 1))


# -- lookup baselines ----------------------------------------------------------------------

DURATION_BINS_S = (600.0, 3600.0, 6 * 3600.0, 24 * 3600.0)


def duration_bin(seconds: float) -> str:
    for at, edge in enumerate(DURATION_BINS_S):
        if seconds < edge:
            return f"d{at}"
    return f"d{len(DURATION_BINS_S)}"


def _key(row: Row, rule: str) -> tuple[str, str]:
    if rule == "model-x-job":
        return str(row.get("model_type", "")), str(row.get("job_type", ""))
    return str(row.get("job_type", "")), duration_bin(float(row.get("declared_duration_s", 0)))


@dataclass(frozen=True)
class LookupRule:
    """Historical readiness rate by a pair of attributes (``model-x-job`` or
    ``job-x-duration``), smoothed towards the overall rate; unseen pairs get the overall
    rate."""

    rule: str
    rates: dict[tuple[str, str], float]
    overall: float

    @classmethod
    def fit(
        cls, rule: str, rows: Sequence[Row], labels: Sequence[bool], *, prior: float = 5.0
    ) -> LookupRule:
        overall = float(np.mean(labels)) if len(labels) else 0.5
        ready: dict[tuple[str, str], float] = {}
        seen: dict[tuple[str, str], int] = {}
        for row, label in zip(rows, labels, strict=True):
            key = _key(row, rule)
            ready[key] = ready.get(key, 0.0) + float(label)
            seen[key] = seen.get(key, 0) + 1
        rates = {k: (ready[k] + prior * overall) / (seen[k] + prior) for k in seen}
        return cls(rule, rates, overall)

    def predict(self, rows: Sequence[Row]) -> FloatArray:
        return np.asarray([self.rates.get(_key(r, self.rule), self.overall) for r in rows])
