"""Scoring retention predictions and gates, and the baselines they are judged against. Pure.

Two baselines, both from the set's solo ``gpu_util`` (nvidia-smi utilisation):

- ``util_sum_rule``: a prediction, ``min(1, 100 / sum)``; as a gate it admits at a floor
  when that prediction meets it;
- ``util_sum_120``: a gate alone, the one-line rule "share when the solo utilisations add up
  to at most 120%", the same at every floor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from agent.estimator.records import Record, Workload

FLOORS = (0.8, 0.9)
GATE_FLOORS = (0.8, 0.85, 0.9)
UTIL_SUM_LIMIT = 120.0


def util_sum(record: Record) -> float:
    return record.target.counters.get("gpu_util", 0.0) + sum(
        p.counters.get("gpu_util", 0.0) for p in record.peers
    )


def rule_of_sum(total: float) -> float:
    return 1.0 if total <= 100.0 else 100.0 / total


def util_sum_rule(record: Record) -> float:
    return rule_of_sum(util_sum(record))


def util_sum_rule_set(workloads: Sequence[Workload]) -> float:
    return rule_of_sum(sum(w.counters.get("gpu_util", 0.0) for w in workloads))


def scores(truth: npt.ArrayLike, predicted: npt.ArrayLike) -> dict[str, float]:
    t = np.asarray(truth)
    p = np.asarray(predicted)
    result = {"mae": float(np.mean(np.abs(t - p))), "rmse": float(math.sqrt(np.mean((t - p) ** 2)))}
    for floor in FLOORS:
        result[f"accuracy_at_{floor}"] = float(np.mean((t >= floor) == (p >= floor)))
    return result


def precision_recall(
    truth: npt.ArrayLike, admitted: npt.ArrayLike, floor: float
) -> tuple[float, float]:
    """Precision (admitted sets that really keep the floor) and recall (such sets that were
    admitted); 1.0 where nothing was admitted, or nothing could be."""
    good = np.asarray(truth) >= floor
    taken = np.asarray(admitted, dtype=bool)
    precision = float(np.mean(good[taken])) if taken.any() else 1.0
    recall = float(np.mean(taken[good])) if good.any() else 1.0
    return precision, recall


def gate(truth: npt.ArrayLike, lower: npt.ArrayLike) -> dict[str, float]:
    """Admit when the conservative estimate meets the floor, at each of ``GATE_FLOORS``."""
    low = np.asarray(lower)
    result = {}
    for floor in GATE_FLOORS:
        precision, recall = precision_recall(truth, low >= floor, floor)
        result[f"gate_precision_at_{floor}"] = precision
        result[f"gate_recall_at_{floor}"] = recall
    return result


def fixed_gate(truth: npt.ArrayLike, admitted: npt.ArrayLike) -> dict[str, float]:
    """A gate whose decision does not depend on the floor (``util_sum_120``)."""
    result = {}
    for floor in GATE_FLOORS:
        precision, recall = precision_recall(truth, admitted, floor)
        result[f"gate_precision_at_{floor}"] = precision
        result[f"gate_recall_at_{floor}"] = recall
    return result


def baselines(records: Sequence[Record], truth: npt.ArrayLike) -> dict[str, dict[str, float]]:
    """The two utilisation-sum baselines on labelled records."""
    sums = np.asarray([util_sum(r) for r in records])
    rule = np.asarray([rule_of_sum(s) for s in sums])
    return {
        "util_sum_rule": {**scores(truth, rule), **gate(truth, rule)},
        "util_sum_120": fixed_gate(truth, sums <= UTIL_SUM_LIMIT),
    }


def beats(forest: dict[str, float], rule: dict[str, float], floor: float = 0.85) -> bool:
    """The forest's gate is at least as precise and admits at least as many good sets."""
    key = f"_at_{floor}"
    return (
        forest[f"gate_precision{key}"] >= rule[f"gate_precision{key}"]
        and forest[f"gate_recall{key}"] >= rule[f"gate_recall{key}"]
    )


def gate_curve(
    truth: npt.ArrayLike, lower: npt.ArrayLike, floors: Sequence[float]
) -> tuple[list[float], list[float]]:
    """Precision and recall of a gate at each floor (for the report's plot)."""
    pairs = [precision_recall(truth, np.asarray(lower) >= f, f) for f in floors]
    return [p for p, _r in pairs], [r for _p, r in pairs]
