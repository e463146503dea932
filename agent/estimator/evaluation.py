"""Scoring retention predictions and gates, and the baselines they are judged against. Pure.

A baseline applies only where the records carry what it reads. From the set's solo
``gpu_util`` (nvidia-smi utilisation), when every workload of every record has it:

- ``util_sum_rule``: a prediction, ``min(1, 100 / sum)``; as a gate it admits at a floor
  when that prediction meets it;
- ``util_sum_120``: a gate alone, the one-line rule "share when the solo utilisations add up
  to at most 120%", the same at every floor;
- ``util_sum_best``: the same rule at its best limit for each floor and precision: the
  recall of "sum <= T" with T chosen, on the very records it is scored on, as the highest
  limit that still reaches the precision (a generous baseline).

Always: ``admit_all`` (the training mean's gate: every set admitted, precision the share
that keeps the floor).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from agent.estimator.operating import threshold_for
from agent.estimator.records import Record, Workload, counters_at_share

FLOORS = (0.8, 0.9)
GATE_FLOORS = (0.8, 0.85, 0.9)
UTIL_SUM_LIMIT = 120.0


def util_sum(record: Record) -> float:
    return sum(counters_at_share(w).get("gpu_util", 0.0) for w in (record.target, *record.peers))


def util_rule_applies(records: Sequence[Record]) -> bool:
    """The utilisation-sum rules read solo ``gpu_util``: they apply only when every workload
    of every record carries it."""
    return bool(records) and all(
        "gpu_util" in counters_at_share(w) for r in records for w in (r.target, *r.peers)
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


def baselines(
    records: Sequence[Record], truth: npt.ArrayLike, precision: float = 0.95
) -> dict[str, dict[str, float | None]]:
    """The applicable baselines on labelled records (see the module's docstring)."""
    t = np.asarray(truth, dtype=np.float64)
    result: dict[str, dict[str, float | None]] = {
        "admit_all": dict(fixed_gate(t, np.ones(t.shape, dtype=bool)))
    }
    if not util_rule_applies(records):
        return result
    sums = np.asarray([util_sum(r) for r in records])
    rule = np.asarray([rule_of_sum(s) for s in sums])
    result["util_sum_rule"] = {**scores(t, rule), **gate(t, rule)}
    result["util_sum_120"] = dict(fixed_gate(t, sums <= UTIL_SUM_LIMIT))
    result["util_sum_best"] = best_limit(t, sums, precision)
    return result


def best_limit(
    truth: npt.NDArray[np.float64], sums: npt.ArrayLike, precision: float
) -> dict[str, float | None]:
    """Precision, recall and limit of "sum <= T" at each of ``GATE_FLOORS``, T the highest
    limit that reaches ``precision`` on these records (none: nothing admitted)."""
    negated = -np.asarray(sums, dtype=np.float64)
    result: dict[str, float | None] = {}
    for floor in GATE_FLOORS:
        threshold, reached, recall = threshold_for(negated, truth >= floor, precision)
        # no limit reaches the precision: it admits nothing, and shows no precision
        result[f"gate_precision_at_{floor}"] = reached if threshold is not None else None
        result[f"gate_recall_at_{floor}"] = recall
        result[f"limit_at_{floor}"] = -threshold if threshold is not None else None
    return result


def gate_curve(
    truth: npt.ArrayLike, lower: npt.ArrayLike, floors: Sequence[float]
) -> tuple[list[float], list[float]]:
    """Precision and recall of a gate at each floor (for the report's plot)."""
    pairs = [precision_recall(truth, np.asarray(lower) >= f, f) for f in floors]
    return [p for p, _r in pairs], [r for _p, r in pairs]
