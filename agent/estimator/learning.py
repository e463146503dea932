"""Learning on the node: retrain the retention model on the node's own run records (plus
base records) and keep the new model only when it beats the current one. Pure but for
scikit-learn's CPU time: run it off the event loop.

    outcome = retrain(current, node_records, base_records, gate_precision=0.95)
    if outcome.swapped:
        path = save_learned(outcome, directory, history=[...])   # a model folder
        model = RetentionModel.load(path)

How the two are compared, on the node's records only (what this node runs is what the
model must get right here), grouped by workload family:

- the **candidate** is trained by the full pipeline (``training.train``: checked
  constraints, forest or line, calibration, the estimate the gate decides on, operating
  point) on the base records and all the node's; its figures on the node come from models
  of the same kind fitted without each node family in turn (its estimate for the MAE, the
  estimate its gate decides on for the gate), so every node record is predicted by a model
  that never saw its family;
- the **current** model predicts the node's records as it is (it may have learnt from them
  in an earlier swap: that only favours it); without a model, the gate's fallback rule.

The candidate replaces the current model only when, on the node's records, its MAE is
lower by at least ``MIN_GAIN`` (relative), its gate at floor 0.85 is at least as precise as
the lower of the current gate's precision and the wanted one (less ``PRECISION_SLACK``),
and it admits at least as many of the sets that keep the floor (less ``RECALL_SLACK``)
unless it is more precise, and some where the current gate admits some: a lower error never
buys a gate that breaks its precision or stops admitting.

Retention means one thing in both sets: node records set a lease's rate next to others
against its rate *alone at its own share* (``retention_basis: share``; the node never sees
it on the whole device), so base records are used where they say the same, or where their
target runs at full threads and "alone at its share" and "alone on the device" are the same
run.
``outcome.reason`` is one sentence for the event; ``outcome.figures`` the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.core.errors import ValidationError
from agent.estimator import operating
from agent.estimator.compiled import CompiledForest
from agent.estimator.evaluation import precision_recall, util_sum_rule
from agent.estimator.model import RetentionModel
from agent.estimator.records import Record, family_of, to_json
from agent.estimator.training import (
    FloatArray,
    TrainResult,
    data_hash,
    fit_winner,
    matrix,
    save,
    train,
)
from agent.estimator.transfer import refit

MIN_GAIN = 0.02  # relative MAE the candidate must win by
PRECISION_SLACK = 0.02
RECALL_SLACK = 0.05
GATE_FLOOR = 0.85
FIT_FOLDS = 5  # grouped folds of the candidate's own training (bounded time on a node)


@dataclass
class Retrained:
    swapped: bool
    reason: str
    figures: dict[str, float] = field(default_factory=dict)
    result: TrainResult | None = None
    records: list[Record] = field(default_factory=list)


def retrain(
    current: RetentionModel | None,
    node_records: Sequence[Record],
    base_records: Sequence[Record],
    *,
    gate_precision: float = operating.DEFAULT_PRECISION,
    trees: int = 60,
    seed: int = 0,
) -> Retrained:
    node = [r for r in node_records if r.retention is not None]
    base = [r for r in base_records if r.retention is not None and _same_basis(r)]
    figures: dict[str, float] = {"node_records": float(len(node)), "base_records": float(len(base))}
    if not node:
        return Retrained(False, "no run records from this node yet", figures)
    figures["families"] = float(len({family_of(r.target) for r in node}))
    everything = base + node
    try:
        result = train(
            everything, folds=FIT_FOLDS, trees=trees, seed=seed, gate_precision=gate_precision
        )
    except ValidationError as exc:  # too few families, or nothing learnable
        return Retrained(False, f"no candidate: {exc}", figures)
    candidate = _candidate_on_node(result, base, node, trees, seed, gate_precision)
    figures.update(candidate)
    figures.update(_current_on_node(current, node, gate_precision))
    swapped, reason = verdict(figures, gate_precision)
    return Retrained(swapped, reason, figures, result if swapped else None, everything)


def _same_basis(record: Record) -> bool:
    """Whether a base record's retention means what a node record's does: set against the
    target alone at its own share; a "device" record at full threads is the same run."""
    return record.retention_basis == "share" or record.target.thread_pct >= 100.0


def _candidate_on_node(
    result: TrainResult,
    base: list[Record],
    node: list[Record],
    trees: int,
    seed: int,
    precision: float,
) -> dict[str, float]:
    """The candidate's MAE and gate on the node's records, each family predicted by a model
    of the candidate's kind fitted without it."""
    families = [family_of(r.target) for r in node]
    x_node = matrix(node, result.names)
    y_node = np.asarray([r.retention for r in node], dtype=np.float64)
    mean, decided, doubt = np.zeros_like(y_node), np.zeros_like(y_node), np.zeros_like(y_node)
    for family in sorted(set(families)):
        held = np.asarray([f == family for f in families])
        rest = base + [r for r, f in zip(node, families, strict=True) if f != family]
        if not rest:  # the node's only family and no base records: nothing to fit on
            mean[held] = decided[held] = float(np.mean(y_node))
            continue
        x = matrix(rest, result.names)
        y = np.asarray([r.retention for r in rest], dtype=np.float64)
        mean[held], (decided[held], doubt[held]) = _fitted_without(
            result, x, y, x_node[held], trees, seed
        )
    p = operating.p_keep(
        decided, doubt, GATE_FLOOR, result.predictive["q"], float(result.predictive["eps"])
    )
    threshold = operating.threshold_at(result.gate, GATE_FLOOR, precision)
    got_precision, got_recall = precision_recall(
        y_node, operating.admitted(p, threshold), GATE_FLOOR
    )
    return {
        "candidate_mae": float(np.mean(np.abs(y_node - mean))),
        "candidate_precision": got_precision,
        "candidate_recall": got_recall,
    }


def _fitted_without(
    result: TrainResult, x: FloatArray, y: FloatArray, asked: FloatArray, trees: int, seed: int
) -> tuple[FloatArray, tuple[FloatArray, FloatArray]]:
    """The candidate's estimate for ``asked``, and what its gate decides on, each refitted
    on ``x``, ``y`` as the candidate chose them."""
    if result.structure is not None:
        own = refit(result.structure, x, y, trees, seed, result.constraints)
        m, s = own.predict_with_spread(asked)
    else:
        forest, line = fit_winner(
            result.regressor, x, y, result.names, trees, seed, result.constraints
        )
        m, s = (
            line if line is not None else CompiledForest.from_sklearn(forest)
        ).predict_with_spread(asked)
    if result.decision is None:
        return m, (m, s)
    decision = refit(result.decision, x, y, trees, seed, result.constraints)
    return m, decision.predict_with_spread(asked)


def _current_on_node(
    current: RetentionModel | None, node: list[Record], precision: float
) -> dict[str, float]:
    y_node = np.asarray([r.retention for r in node], dtype=np.float64)
    if current is None:  # the gate's fallback: the utilisation-sum rule
        rule = np.asarray([util_sum_rule(r) for r in node])
        got_precision, got_recall = precision_recall(y_node, rule >= GATE_FLOOR, GATE_FLOOR)
        return {
            "current_mae": float(np.mean(np.abs(y_node - rule))),
            "current_precision": got_precision,
            "current_recall": got_recall,
        }
    found = current.estimate(node)
    _p, admitted = current.admits(found, GATE_FLOOR, precision)
    got_precision, got_recall = precision_recall(y_node, admitted, GATE_FLOOR)
    return {
        "current_mae": float(np.mean(np.abs(y_node - found.mean))),
        "current_precision": got_precision,
        "current_recall": got_recall,
    }


def verdict(figures: dict[str, float], precision: float) -> tuple[bool, str]:
    """Whether the candidate replaces the current model, and why (see the module)."""
    current, candidate = figures["current_mae"], figures["candidate_mae"]
    if not candidate < current * (1 - MIN_GAIN):
        return False, (
            f"the candidate's MAE on this node's records ({candidate:.4f}) is not at least "
            f"{MIN_GAIN:.0%} under the current model's ({current:.4f})"
        )
    floor_precision = min(figures["current_precision"], precision) - PRECISION_SLACK
    if figures["candidate_precision"] < floor_precision:
        return False, (
            f"the candidate's gate at floor {GATE_FLOOR} is less precise on this node's "
            f"records ({figures['candidate_precision']:.3f}) than the current one's "
            f"({figures['current_precision']:.3f})"
        )
    recall, was = figures["candidate_recall"], figures["current_recall"]
    stops = recall == 0.0 < was
    loses = recall < was - RECALL_SLACK
    if stops or (
        loses and figures["candidate_precision"] <= figures["current_precision"] + PRECISION_SLACK
    ):
        return False, (
            f"the candidate's gate at floor {GATE_FLOOR} admits fewer of this node's good "
            f"sets ({figures['candidate_recall']:.3f}) than the current one's "
            f"({figures['current_recall']:.3f})"
        )
    return True, (
        f"the candidate's MAE on this node's records is {candidate:.4f} against "
        f"{current:.4f}, its gate at floor {GATE_FLOOR} precision "
        f"{figures['candidate_precision']:.3f} recall {figures['candidate_recall']:.3f}"
    )


def save_learned(outcome: Retrained, directory: Path, *, history: list[dict[str, Any]]) -> Path:
    """The swapped-in model as a model folder (what ``RetentionModel.load`` reads), with the
    learning history in its metadata."""
    if outcome.result is None:
        raise ValueError("only a swapped-in candidate is saved")
    lines = [to_json(r) for r in outcome.records]
    node = int(outcome.figures.get("node_records", 0))
    save(
        outcome.result,
        directory,
        data_sha256=data_hash(lines),
        records=len(lines),
        provenance=f"learned on the node: {node} node records + {len(lines) - node} base records",
        extra={"learning": {"history": history, "figures": outcome.figures}},
    )
    return directory
