"""`gpushare estimator` end to end: synthetic data, train, predict, evaluate."""

import json
import subprocess
from pathlib import Path

import pytest

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
    table = {
        line.split()[0]: [float(v) for v in line.split()[1:]]
        for line in trained.stdout.splitlines()[1:4]
    }
    assert table["forest"][0] < table["mean"][0] and table["forest"][0] < table["util_sum_rule"][0]
    metadata = json.loads((model / "model.json").read_text())
    assert metadata["features"] and metadata["data_sha256"] and metadata["versions"]

    predicted = run("predict", "--model", str(model), "--data", str(holdout))
    assert predicted.returncode == 0, predicted.stderr
    lines = [json.loads(x) for x in predicted.stdout.splitlines()]
    source = [json.loads(x) for x in holdout.read_text().splitlines()]
    assert len(lines) == len(source)
    assert [x["target"]["workload"] for x in lines] == [x["target"]["workload"] for x in source]
    assert all(x["retention_lower"] <= x["predicted_retention"] + 1e-9 for x in lines)

    evaluated = run("evaluate", "--model", str(model), "--data", str(holdout))
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads(evaluated.stdout)
    assert metrics["records"] == len(source) and metrics["mae"] < 0.2
    assert {"gate_precision_at_0.85", "gate_recall_at_0.9"} <= set(metrics)


def test_bad_records_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"gpu": {"model": "x", "memory_bytes": 1}, "retention": 0.5}\n')
    result = run("train", "--data", str(bad), "--out", str(tmp_path / "m"))
    assert result.returncode == 2 and "line 1: target" in result.stderr
