"""What transfers to families the estimator never saw (issue: the gate never loses to a
one-line rule on workloads it has not seen), on the family-shift worlds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.estimator.evaluation import precision_recall
from agent.estimator.features import counter_names, feature_names, monotonic
from agent.estimator.learning import retrain, save_learned
from agent.estimator.model import DEFAULT_MODEL_DIR, RetentionModel
from agent.estimator.records import Record, family_of
from agent.estimator.study import nested_gate
from agent.estimator.synthetic import family_shift_runs
from agent.estimator.training import matrix, save, train
from agent.estimator.transfer import like_groups
from agent.sim.synth import runs

FLOOR, PRECISION = 0.85, 0.95
pytestmark = pytest.mark.timeout(300)


def _split(records: list[Record], unseen: tuple[str, ...]) -> tuple[list[Record], list[Record]]:
    far = [family_of(r.target).startswith(unseen) for r in records]
    return (
        [r for r, f in zip(records, far, strict=True) if not f],
        [r for r, f in zip(records, far, strict=True) if f],
    )


def _gate_on(records: list[Record], tmp_path: Path, asked: list[Record]) -> tuple[float, float]:
    result = train(records, folds=0, trees=30, seed=0, check_constraints=False)
    save(result, tmp_path, data_sha256="t", records=len(records), provenance="test")
    model = RetentionModel.load(tmp_path)
    truth = np.asarray([r.retention for r in asked], dtype=np.float64)
    _p, admitted = model.admits(model.estimate(asked), FLOOR, PRECISION)
    return precision_recall(truth, admitted, FLOOR)


def test_on_families_of_kinds_never_seen_the_gate_keeps_its_precision(tmp_path: Path) -> None:
    # Kinds 1 and 4 are held out whole: the forest learnt the other kinds' sensitivities
    # from their signature counter, and held out one family at a time (each with siblings)
    # it looked right; on the new kinds that signature says nothing. Before the gate chose
    # by what transfers, its precision on the new kinds was 0.920, 0.883, 0.859 and 0.776
    # on these four worlds.
    admitted_good = admitted = 0.0
    for seed in (4, 5, 7, 8):
        seen, asked = _split(family_shift_runs(700, seed=seed), ("kind1", "kind4"))
        precision, recall = _gate_on(seen, tmp_path / str(seed), asked)
        # a gate that admits nothing keeps its precision trivially
        assert recall > 0.1, (seed, precision, recall)
        goods = sum((r.retention or 0.0) >= FLOOR for r in asked)
        admitted_good += recall * goods
        admitted += recall * goods / precision
    assert admitted_good / admitted >= PRECISION, admitted_good / admitted


def test_where_nothing_carries_across_families_the_gate_keeps_the_base_and_loses_nothing() -> None:
    # every family its own kind: what the forest learns of one says nothing of another.
    # Nested over groups of like families (train run without each fold, its model asked
    # about it), mean over three worlds: the gate admits at least what the best rule and the
    # base do, their limits chosen in the same inner loop, and the correction is rarely kept.
    # (Before the study was nested in what is fitted too, the gate was 0.05 under the base
    # on these worlds: a correction won inner loops whose models had seen the outer group.)
    found = [
        nested_gate(family_shift_runs(600, seed=seed, kinds=12, per_kind=1), trees=20, outer=4)
        for seed in (0, 1, 2)
    ]
    gate = np.mean([f["gate"]["heldout_recall"] for f in found])
    rule = np.mean([f[f["best_rule"]]["heldout_recall"] for f in found])
    base = np.mean([f["base"]["heldout_recall"] for f in found])
    assert gate >= max(rule, base) - 0.01, (gate, rule, base)
    picked = [n for f in found for n, k in f["picked"].items() for _ in range(k)]
    corrected = sum(n.startswith("corrected") for n in picked)
    assert corrected <= len(picked) / 4, picked


def test_records_from_the_node_move_a_model_trained_elsewhere_toward_the_nodes_truth(
    tmp_path: Path,
) -> None:
    # Elsewhere: kinds 0-3. The node runs kinds 4 and 5, whose sensitivities nothing seen
    # elsewhere tells (no effect carries across kinds in this world).
    world = family_shift_runs(700, seed=3)
    elsewhere, node_world = _split(world, ("kind4", "kind5"))
    node, fresh = node_world[: len(node_world) // 2], node_world[len(node_world) // 2 :]
    result = train(elsewhere, folds=0, trees=20, seed=0, check_constraints=False)
    save(result, tmp_path / "elsewhere", data_sha256="t", records=len(elsewhere), provenance="t")
    current = RetentionModel.load(tmp_path / "elsewhere")
    outcome = retrain(current, node, elsewhere, trees=20)
    assert outcome.swapped, outcome.reason
    learned = RetentionModel.load(save_learned(outcome, tmp_path / "learned", history=[]))
    truth = np.asarray([r.retention for r in fresh], dtype=np.float64)

    def mae(model: RetentionModel) -> float:
        return float(np.mean(np.abs(model.estimate(fresh).mean - truth)))

    assert mae(learned) < mae(current) * 0.9, (mae(learned), mae(current))
    # never dominated, on the records it learned from: its choice, and the gate chosen
    # without each group of like families in turn, admit at least what the best rule does
    choice = learned.metadata["cross_validation"]["gate_choice"]
    assert choice["gate_heldout_recall"] >= (choice["best_rule_heldout_recall"] or 0) - 0.01
    found = nested_gate(outcome.records, trees=10, outer=4)
    best = found[found["best_rule"]]["heldout_recall"]
    assert found["gate"]["heldout_recall"] >= best - 0.01, (found["gate"], best)
    # and on the node's new sets it is as precise as wanted
    _p, admitted = learned.admits(learned.estimate(fresh), FLOOR, PRECISION)
    precision, recall = precision_recall(truth, admitted, FLOOR)
    assert precision >= PRECISION and recall > 0.3, (precision, recall)


def test_the_shipped_model_still_gates_and_a_retrain_can_replace_it(tmp_path: Path) -> None:
    shipped = RetentionModel.load(DEFAULT_MODEL_DIR)  # schema 3: decides on its own forest
    assert shipped.decision is None and shipped.decides_on == "forest"
    node = family_shift_runs(300, seed=5, kinds=4)
    found = shipped.estimate(node)
    assert found.decided is None and (found.gate_mean == found.mean).all()
    _p, admitted = shipped.admits(found, FLOOR, PRECISION)
    assert admitted.dtype == bool and admitted.shape == (len(node),)
    outcome = retrain(shipped, node, [], trees=15)
    assert outcome.swapped, outcome.reason
    learned = RetentionModel.load(save_learned(outcome, tmp_path / "learned", history=[]))
    assert learned.metadata["cross_validation"]["gate_choice"]["estimate"]


def test_only_near_twins_are_held_out_together() -> None:
    # the quick example's 30 contention families are alike but no two are twins: each is
    # held out alone; a copy of one family under another name is held out with it
    records = runs(200, seed=0)
    names = feature_names(counter_names(records)[0])
    x = matrix(records, names)
    y = np.asarray([r.retention for r in records], dtype=np.float64)
    groups = [family_of(r.target) for r in records]
    constraints = [monotonic(n) for n in names]
    alone = like_groups(x, y, groups, names, 10, 0, constraints)
    assert len(set(alone)) == len(set(groups))
    first = groups[0]
    copy = [i for i, g in enumerate(groups) if g == first]
    twin_x, twin_y = np.vstack([x, x[copy]]), np.concatenate([y, y[copy]])
    twin_groups = groups + ["twin"] * len(copy)
    paired = like_groups(twin_x, twin_y, twin_groups, names, 10, 0, constraints)
    label = dict(zip(twin_groups, paired, strict=True))
    assert label["twin"] == label[first]
    assert len(set(paired)) == len(set(groups))
