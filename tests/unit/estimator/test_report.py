"""`evaluate --report`: metrics, curves, and the files a person reads."""

from pathlib import Path

import pytest

from agent.estimator import shares
from agent.estimator.model import DEFAULT_MODEL_DIR, RetentionModel
from agent.estimator.report import PLOTS, evaluate, history_lines, markdown, write
from agent.estimator.synthetic import runs

pytestmark = pytest.mark.timeout(120)  # matplotlib's first import and three figures


@pytest.fixture(scope="module")
def result():  # type: ignore[no-untyped-def]
    model = RetentionModel.load(DEFAULT_MODEL_DIR)
    return model, evaluate(model, runs(60, seed=9))


def test_metrics_name_coverage_and_baselines(result) -> None:  # type: ignore[no-untyped-def]
    model, evaluated = result
    metrics = evaluated["metrics"]
    assert metrics["coverage_nominal"] == model.coverage
    assert 0.0 <= metrics["coverage_achieved"] <= 1.0
    assert set(metrics["baselines"]) == {
        "admit_all",
        "util_sum_rule",
        "util_sum_120",
        "util_sum_best",
    }
    curves = evaluated["curves"]
    assert len(curves["nominal"]) == len(curves["achieved"])
    assert curves["achieved"] == sorted(curves["achieved"]), "more coverage, more covered"


def test_the_gate_at_its_operating_point_and_its_curve_per_floor(result) -> None:  # type: ignore[no-untyped-def]
    model, evaluated = result
    metrics, gates = evaluated["metrics"], evaluated["curves"]["gate"]
    assert metrics["gate_precision_target"] == 0.95
    assert metrics["gate_threshold_at_0.85"] == model.threshold(0.85, 0.95)
    # the shipped model's own 0.95 column kept 0.95 on held-out families, but not by one
    # standard error across groups: the gate runs at the next column that does (0.97), and
    # says what it kept there on families its threshold never saw
    chosen = model.metadata["cross_validation"]["selected"]
    assert chosen["gate_heldout_precision_own_column_at_0.85"] >= 0.95
    assert chosen["gate_column_at_0.85"] == 0.97
    assert chosen["gate_heldout_precision_at_0.85"] >= 0.95
    assert metrics["cv_heldout_precision_at_0.85"] == chosen["gate_heldout_precision_at_0.85"]
    assert set(gates) == {"0.8", "0.85", "0.9"}
    _precision, recall = gates["0.85"]["model"]
    assert recall == sorted(recall, reverse=True), "a higher threshold admits fewer"
    assert gates["0.85"]["operating_point"] == (
        metrics["gate_precision_at_0.85"],
        metrics["gate_recall_at_0.85"],
    )
    assert "util_sum" in gates["0.85"]


def test_without_gpu_util_only_the_baselines_that_apply() -> None:
    model = RetentionModel.load(DEFAULT_MODEL_DIR)
    evaluated = evaluate(model, shares.runs(30, seed=2))
    assert set(evaluated["metrics"]["baselines"]) == {"admit_all"}
    assert "util_sum" not in evaluated["curves"]["gate"]["0.85"]
    assert "util_sum" not in markdown(evaluated["metrics"], model, "b.jsonl")


def test_the_learned_on_node_history_is_a_table() -> None:
    history = [
        {
            "at": "2026-12-05T10:00:00Z",
            "node_records": 120,
            "families": 4,
            "swapped": True,
            "reason": "better",
            "figures": {"current_mae": 0.2, "candidate_mae": 0.05},
        }
    ]
    lines = history_lines({"learning": {"history": history}})
    assert "| 2026-12-05T10:00:00Z | 120 | 4 | yes | 0.2000 | 0.0500 | better |" in lines
    assert history_lines({}) == []
    stamped = history_lines({"learning": {"history": [{**history[0], "at": 1796551200.0}]}})
    assert any(line.startswith("| 2026-12-06 10:00:00Z | 120 |") for line in stamped)


def test_markdown_has_the_gate_table(result) -> None:  # type: ignore[no-untyped-def]
    model, evaluated = result
    text = markdown(evaluated["metrics"], model, "held-out.jsonl")
    assert "held-out.jsonl" in text and "| util_sum_120 | 0.85 |" in text
    assert "coverage: nominal 0.90" in text


def test_write_draws_every_plot(result, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    model, evaluated = result
    written = write(tmp_path / "r", evaluated, model, "x.jsonl")
    assert [p.name for p in written] == [*PLOTS, "summary.md"]
    assert all(p.stat().st_size > 1000 for p in written[:-1])
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written[:-1])
