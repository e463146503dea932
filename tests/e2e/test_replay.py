"""The replay harness reruns from one command and reproduces its tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, subprocess_env


def replay(*args: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "replay.py"), *args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict = json.loads(done.stdout.splitlines()[-1])  # type: ignore[type-arg]
    return result


def test_the_gang_table_is_reproduced_exactly(tmp_path: Path) -> None:
    headline = replay("gang", "--out", str(tmp_path))
    assert headline["gang"]["gang"] == {"gpu_min_held": 1440.0, "gpu_min_useful": 1440.0}
    assert headline["gang"]["pod-by-pod"]["gpu_min_useful"] == 0.0, "workers wait on each other"
    shipped = (REPO / "docs" / "replay" / "gang.csv").read_text()
    assert (tmp_path / "gang.csv").read_text() == shipped
    assert (tmp_path / "gang.png").stat().st_size > 1000


def test_small_runs_repeat_to_the_byte(tmp_path: Path) -> None:
    args = ("fragmentation", "--seeds", "1")
    replay(*args, "--out", str(tmp_path / "a"))
    replay(*args, "--out", str(tmp_path / "b"))
    first = (tmp_path / "a" / "fragmentation.csv").read_text()
    assert first == (tmp_path / "b" / "fragmentation.csv").read_text()
    assert first.count("\n") == 1 + 3 * 3 * 2, "header + lost nodes x rules x queues"


def test_a_small_batch_replay_shows_the_readiness_effect(tmp_path: Path) -> None:
    headline = replay(
        "batch", "--seeds", "2", "--jobs", "2000", "--trees", "10", "--out", str(tmp_path)
    )["batch"]
    assert headline["predictor_lowers_w_at_every_load_above_1"]
    assert headline["true_label_best"]
    assert 0 < headline["predictor_gap_captured_mean"] < 1
    assert "openb" in replay("openb", "--out", str(tmp_path))["openb"]["skipped"]
