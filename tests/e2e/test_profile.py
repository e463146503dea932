"""`gpushare profile` orchestration: solo runs, pairs under MPS, throughput by regex."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import nvml_unavailable_reason
from tests.helpers import agent_command, subprocess_env

WORK = Path(__file__).parents[1] / "data" / "profile" / "work.py"
pytestmark = pytest.mark.timeout(120)


def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    lines = ["version: 1", "workloads:"]
    for name, memory in (("alpha", "2GiB"), ("beta", "4GiB")):
        lines.append(
            f"  - {{name: {name}, command: [{sys.executable}, {WORK}], "
            f"throughput_regex: 'throughput: ([0-9.]+)', memory: {memory}}}"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def profile(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {
        **subprocess_env(),
        "PROFILE_TEST_DIR": str(markers),
        "GPUSHARE_PATHS_RUNTIME_DIR": str(tmp_path / "run"),
    }
    return subprocess.run(
        agent_command(
            "profile",
            "--spec",
            str(spec(tmp_path)),
            "--out",
            str(tmp_path / "out.jsonl"),
            "--duration",
            "1.5",
            "--warmup",
            "0.5",
            "--threads",
            "50",
            "--sim",
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def test_pairs_give_two_records_with_measured_retention(tmp_path: Path) -> None:
    result = profile(tmp_path)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["target"]["workload"] for r in records] == ["alpha", "beta"]
    assert [r["peers"][0]["workload"] for r in records] == ["beta", "alpha"]
    for record in records:
        assert record["retention"] == pytest.approx(0.5, abs=0.1), "two copies share the work"
        assert record["target"]["thread_pct"] == 50.0
        assert "power_w" in record["target"]["counters"]
        # measured alone at its share too: what the estimator reads for an MPS share
        assert set(record["target"]["share_counters"]) == {"50"}
        assert "power_w" in record["target"]["share_counters"]["50"]


def test_a_workload_that_prints_no_throughput_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nworkloads:\n  - {name: quiet, command: [/bin/true], "
        "throughput_regex: 'x: ([0-9]+)'}\n"
    )
    env = {**subprocess_env(), "GPUSHARE_PATHS_RUNTIME_DIR": str(tmp_path / "run")}
    result = subprocess.run(
        agent_command(
            "profile",
            "--spec",
            str(bad),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--duration",
            "0.5",
            "--sim",
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 2 and "quiet" in result.stderr


@pytest.mark.gpu
def test_profile_on_a_real_gpu(tmp_path: Path) -> None:
    assert nvml_unavailable_reason() is None
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {
        **subprocess_env(),
        "PROFILE_TEST_DIR": str(markers),
        "GPUSHARE_PATHS_RUNTIME_DIR": str(tmp_path / "run"),
    }
    result = subprocess.run(
        agent_command(
            "profile",
            "--spec",
            str(spec(tmp_path)),
            "--out",
            str(tmp_path / "out.jsonl"),
            "--duration",
            "3",
            "--warmup",
            "1",
            "--threads",
            "50",
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all("fb_used_bytes" in r["target"]["counters"] for r in records)
