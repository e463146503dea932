"""`gpushare estimator` end to end: synthetic data, train, predict, evaluate."""

import json
import subprocess
from pathlib import Path

import pytest

from agent.estimator.model import DEFAULT_MODEL_DIR
from tests.helpers import agent_command, subprocess_env

pytestmark = pytest.mark.timeout(300)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_command("estimator", *args),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_round_trip(tmp_path: Path) -> None:
    data, holdout, model = tmp_path / "runs.jsonl", tmp_path / "holdout.jsonl", tmp_path / "m"
    assert run("synth", "--out", str(data), "--runs", "600", "--seed", "3").returncode == 0
    assert run("synth", "--out", str(holdout), "--runs", "100", "--seed", "4").returncode == 0
    trained = run("train", "--data", str(data), "--out", str(model), "--trees", "30")
    assert trained.returncode == 0, trained.stderr
    assert "leave-one-family-out" in trained.stderr
    assert "retention_lower coverage: nominal 0.90" in trained.stdout
    table = {
        line.split()[0]: [float(v) for v in line.split()[1:]]
        for line in trained.stdout.splitlines()[1:5]
    }
    assert set(table) == {"forest", "linear", "mean", "util_sum_rule"}
    assert table["forest"][0] < table["mean"][0] and table["forest"][0] < table["util_sum_rule"][0]
    assert "predicted_retention: the forest" in trained.stdout
    assert "model, held-out families" in trained.stdout and "util_sum_best" in trained.stdout
    metadata = json.loads((model / "model.json").read_text())
    assert metadata["features"] and metadata["data_sha256"] and metadata["versions"]
    assert metadata["calibration"]["coverage"] == 0.9 and metadata["regressor"] == "forest"
    assert metadata["gate"]["precision"] == 0.95 and metadata["predictive"]["q"]
    assert not [name for name in metadata["features"] if name.startswith("dc.")]

    predicted = run("predict", "--model", str(model), "--data", str(holdout))
    assert predicted.returncode == 0, predicted.stderr
    lines = [json.loads(x) for x in predicted.stdout.splitlines()]
    source = [json.loads(x) for x in holdout.read_text().splitlines()]
    assert len(lines) == len(source)
    assert [x["target"]["workload"] for x in lines] == [x["target"]["workload"] for x in source]
    assert all(x["retention_lower"] <= x["predicted_retention"] + 1e-9 for x in lines)
    assert {x["retention_coverage"] for x in lines} == {0.9}
    assert all(0.0 <= x["p_keep"] <= 1.0 and isinstance(x["gate_admit"], bool) for x in lines)
    assert {x["gate_admit"] for x in lines} == {True, False}
    lenient = run("predict", "--model", str(model), "--data", str(holdout), "--floor", "0.6")
    at_06 = [json.loads(x) for x in lenient.stdout.splitlines()]
    assert all(a["p_keep"] >= x["p_keep"] - 1e-12 for a, x in zip(at_06, lines, strict=True))
    assert sum(a["gate_admit"] for a in at_06) > sum(x["gate_admit"] for x in lines)
    loose = run("predict", "--model", str(model), "--data", str(holdout), "--coverage", "0.6")
    looser = [json.loads(x)["retention_lower"] for x in loose.stdout.splitlines()]
    assert all(a >= x["retention_lower"] for a, x in zip(looser, lines, strict=True))

    evaluated = run("evaluate", "--model", str(model), "--data", str(holdout))
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads(evaluated.stdout)
    assert metrics["records"] == len(source) and metrics["mae"] < 0.2
    assert {"gate_precision_at_0.85", "gate_recall_at_0.9", "gate_threshold_at_0.85"} <= set(
        metrics
    )
    assert metrics["coverage_nominal"] == 0.9 and "util_sum_best" in metrics["baselines"]


def test_evaluate_writes_a_report_on_another_generator(tmp_path: Path) -> None:
    other, report = tmp_path / "other.jsonl", tmp_path / "report"
    made = run("synth", "--out", str(other), "--runs", "80", "--generator", "interference")
    assert made.returncode == 0 and "interference" in made.stdout
    evaluated = run(
        "evaluate",
        "--model",
        str(DEFAULT_MODEL_DIR),
        "--data",
        str(other),
        "--report",
        str(report),
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["records"] == len(other.read_text().splitlines())
    names = {p.name for p in report.iterdir()}
    assert names == {"calibration.png", "predicted_vs_true.png", "gate.png", "summary.md"}
    assert "![calibration](calibration.png)" in (report / "summary.md").read_text()


def test_training_without_gpu_util_names_no_utilisation_rule(tmp_path: Path) -> None:
    data, model = tmp_path / "shares.jsonl", tmp_path / "m"
    assert (
        run("synth", "--out", str(data), "--runs", "200", "--generator", "shares").returncode == 0
    )
    trained = run("train", "--data", str(data), "--out", str(model), "--trees", "20")
    assert trained.returncode == 0, trained.stderr
    assert "util_sum" not in trained.stdout
    assert "no utilisation-sum baseline: the records carry no gpu_util" in trained.stdout
    assert all(json.loads(x)["retention_basis"] == "share" for x in data.read_text().splitlines())


def test_training_on_both_retention_bases_warns(tmp_path: Path) -> None:
    device, share = tmp_path / "device.jsonl", tmp_path / "share.jsonl"
    assert run("synth", "--out", str(device), "--runs", "120").returncode == 0
    assert (
        run("synth", "--out", str(share), "--runs", "60", "--generator", "shares").returncode == 0
    )
    both = tmp_path / "both.jsonl"
    both.write_text(device.read_text() + share.read_text())
    trained = run("train", "--data", str(both), "--out", str(tmp_path / "m"), "--trees", "10")
    assert trained.returncode == 0, trained.stderr
    assert "against the whole device and" in trained.stdout and "own share" in trained.stdout


def test_evaluate_refuses_a_file_without_records(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = run("evaluate", "--model", str(DEFAULT_MODEL_DIR), "--data", str(empty))
    assert result.returncode == 2 and "no records to evaluate on" in result.stderr


def test_train_needs_data_and_out_or_the_node(tmp_path: Path) -> None:
    alone = run("train", "--out", str(tmp_path / "m"))
    assert alone.returncode == 2 and "give --data and --out" in alone.stderr
    both = run("train", "--from-node", "--out", str(tmp_path / "m"))
    assert both.returncode == 2 and "takes no --data or --out" in both.stderr


def test_bad_records_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"gpu": {"model": "x", "memory_bytes": 1}, "retention": 0.5}\n')
    result = run("train", "--data", str(bad), "--out", str(tmp_path / "m"))
    assert result.returncode == 2 and "line 1: target" in result.stderr
