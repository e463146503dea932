"""`evaluate --report`: metrics, curves, and the files a person reads."""

from pathlib import Path

import pytest

from agent.estimator.model import DEFAULT_MODEL_DIR, RetentionModel
from agent.estimator.report import PLOTS, evaluate, markdown, write
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
    assert set(metrics["baselines"]) == {"util_sum_rule", "util_sum_120"}
    curves = evaluated["curves"]
    assert len(curves["nominal"]) == len(curves["achieved"])
    assert curves["achieved"] == sorted(curves["achieved"]), "more coverage, more covered"


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
