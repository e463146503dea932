"""Too little data gets a sentence with the counts, not a library warning or traceback."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import cli


@pytest.mark.parametrize("command", ["evaluate", "train"])
def test_thirty_rows_are_refused_with_the_counts(tmp_path: Path, command: str) -> None:
    runner = CliRunner()
    csv = tmp_path / "jobs.csv"
    made = runner.invoke(cli, ["readiness", "synth", "--out", str(csv), "--jobs", "30"], obj={})
    assert made.exit_code == 0, made.output
    extra = ["--out", str(tmp_path / "m")] if command == "train" else []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a library warning would fail the test
        result = runner.invoke(cli, ["readiness", command, "--csv", str(csv), *extra], obj={})
    assert result.exit_code == 2
    assert "need at least 50 rows with both outcomes" in result.output
    assert "got 30 (" in result.output
    assert "Traceback" not in result.output and "n_splits" not in result.output
