"""Learning on the node: a wrong model is replaced by one trained on the node's records; a
candidate that does not beat the current model on the node's records is never swapped in.
The node's records come from the simulated node's contention model."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agent.estimator import shares
from agent.estimator.learning import MIN_GAIN, retrain, save_learned
from agent.estimator.model import RetentionModel
from agent.estimator.records import Record
from agent.estimator.synthetic import runs as other_world
from agent.estimator.training import save, train
from agent.sim.synth import runs

pytestmark = pytest.mark.timeout(600)


def _inverted(records: list[Record]) -> list[Record]:
    """The world upside down: sets that keep their speed labelled as losing it."""
    return [replace(r, retention=round(1.2 - (r.retention or 0.0), 4)) for r in records]


def _model(records: list[Record], folder: Path) -> RetentionModel:
    result = train(records, folds=4, trees=15, check_constraints=False)
    save(result, folder, data_sha256="x", records=len(records), provenance="test")
    return RetentionModel.load(folder)


def _mae(model: RetentionModel, records: list[Record]) -> float:
    mean, _lower = model.predict(records)
    return float(np.mean(np.abs(np.asarray(mean) - [r.retention for r in records])))


@pytest.fixture(scope="module")
def node_records() -> list[Record]:
    return runs(160, seed=11, workload_count=12)


def test_a_wrong_model_is_replaced_and_the_new_one_is_kept(
    node_records: list[Record], tmp_path: Path
) -> None:
    wrong = _model(_inverted(runs(150, seed=3, workload_count=10)), tmp_path / "wrong")
    base = runs(60, seed=5, workload_count=8)
    outcome = retrain(wrong, node_records, base, trees=20)
    figures = outcome.figures
    assert outcome.swapped, outcome.reason
    assert figures["candidate_mae"] < figures["current_mae"] * (1 - MIN_GAIN)
    assert figures["node_records"] == len(node_records) and figures["families"] == 12
    learned = RetentionModel.load(
        save_learned(outcome, tmp_path / "learned", history=[{"swapped": True}])
    )
    assert learned.metadata["learning"]["history"] == [{"swapped": True}]
    assert "learned on the node" in learned.metadata["provenance"]
    fresh = runs(60, seed=12, workload_count=12)  # new sets of the node's workloads
    assert _mae(learned, fresh) < _mae(wrong, fresh) / 3
    again = retrain(learned, node_records, base, trees=20)
    assert not again.swapped and "not at least" in again.reason
    assert again.result is None


def test_a_candidate_from_another_world_does_not_replace_a_good_model(tmp_path: Path) -> None:
    good = _model(runs(300, seed=21, workload_count=16), tmp_path / "good")
    node = runs(12, seed=22, workload_count=3)  # a few records of three families
    base = other_world(300, seed=23)  # most of what the candidate learns is unlike the node
    outcome = retrain(good, node, base, trees=20)
    assert not outcome.swapped, outcome.figures
    assert outcome.figures["current_mae"] <= outcome.figures["candidate_mae"] / (1 - MIN_GAIN)


def test_nothing_to_learn_from_yet() -> None:
    outcome = retrain(None, [], runs(20, seed=1))
    assert not outcome.swapped and "no run records" in outcome.reason
    with pytest.raises(ValueError, match="only a swapped-in"):
        save_learned(outcome, Path("unused"), history=[])


def test_without_a_model_the_candidate_is_judged_against_the_fallback_rule(
    node_records: list[Record],
) -> None:
    outcome = retrain(None, node_records, [], trees=15)
    figures = outcome.figures
    assert all(np.isfinite(v) for v in figures.values()), figures
    assert outcome.swapped and figures["candidate_mae"] < figures["current_mae"]


BETTER = {
    "current_mae": 0.10,
    "candidate_mae": 0.05,
    "current_precision": 0.96,
    "candidate_precision": 0.95,
    "current_recall": 0.80,
    "candidate_recall": 0.82,
}


@pytest.mark.parametrize(
    ("change", "swapped", "why"),
    [
        ({}, True, "against"),
        ({"candidate_mae": 0.099}, False, "not at least 2% under"),  # 1% better: noise
        ({"candidate_mae": 0.12}, False, "not at least 2% under"),
        ({"candidate_precision": 0.92}, False, "less precise"),
        # the current gate is imprecise: the candidate need only match it, less the slack
        ({"current_precision": 0.80, "candidate_precision": 0.79}, True, "against"),
        # a gate that stops admitting is not bought with a lower error
        ({"candidate_recall": 0.0, "candidate_precision": 1.0}, False, "admits fewer"),
        ({"candidate_recall": 0.76}, True, "against"),  # within the recall slack
        ({"candidate_recall": 0.6}, False, "admits fewer"),  # fewer, and no more precise
        # fewer, but far more precise than a gate that was wrong half the time
        (
            {"current_precision": 0.5, "candidate_recall": 0.42, "candidate_precision": 0.94},
            True,
            "against",
        ),
    ],
)
def test_the_verdict(change: dict[str, float], swapped: bool, why: str) -> None:
    from agent.estimator.learning import verdict

    got, reason = verdict({**BETTER, **change}, 0.95)
    assert got is swapped and why in reason


def test_base_records_mix_in_where_retention_means_the_same(node_records: list[Record]) -> None:
    base = runs(60, seed=5, workload_count=8)  # against the whole device
    full = [r for r in base if r.target.thread_pct >= 100]
    assert 0 < len(full) < len(base)
    mps = shares.runs(20, seed=6)  # against the workload alone at its share, as the node's
    assert {r.retention_basis for r in mps} == {"share"}
    assert any(r.target.thread_pct < 100 for r in mps)
    outcome = retrain(None, node_records, base + mps, trees=10)
    assert outcome.figures["base_records"] == len(full) + len(mps)
