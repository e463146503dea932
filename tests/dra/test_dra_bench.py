"""bench/dra.py at its small size (4 nodes, 200 pods, a fifth of them asking only for the
extended resource): every pod bound, prepared, run and gone, and nothing leaked,
overcommitted or run under another claim's lease or limits. The speed, CPU and
slice-write figures are the benchmark's to report, not asserted here. And ``--scale`` at a
tiny size: its figures' keys and types."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers import REPO, run_bench_small, subprocess_env

KEYS = (
    "pods",
    "prepared",
    "pods_per_s",
    "leases_leaked",
    "wrong_injections",
    "overcommit",
    "lost",
    "agent_cpu_ms_per_prepare_unprepare",
    "agent_cpu_ms_per_noop",
    "slice_writes_per_node_per_s_max",
)


@pytest.mark.timeout(300)
def test_the_small_dra_run_prepares_every_pod_and_leaks_nothing() -> None:
    result = run_bench_small("dra.py", 300, "--json-only")
    assert set(KEYS) <= set(result), sorted(set(KEYS) - set(result))
    why = {k: result[k] for k in ("lost_why", "scheduling_failures_why")}
    assert result["pods"] == result["bound"] == result["running"] == 200, (result, why)
    assert result["prepared"] == result["unprepared"] == 200, result
    assert result["extended_pods"] > 0, result
    for key in (
        "leases_leaked",
        "wrong_injections",
        "unverified",
        "overcommit",
        "unprepare_errors",
        "quiet_failed",
        "lost",
    ):
        assert result[key] == 0, (key, result[key], why)
    # every check had something to look at
    assert result["ledger_reads"] > 0 and result["api_samples"] > 0, result
    assert result["slice_writes"] > 0 and result["quiet_pairs"] > 0, result
    assert result["agent_cpu_ms_per_noop"] > 0, result
    assert result["agent_cpu_ms_per_prepare_unprepare"] > 0, result


SCALE_KEYS = {
    "agent_cpu_ms_per_pod_by_nodes": dict,
    "foreign_claim_bytes_read_max": int,
    "agent_rss_growth_mib_foreign_claims": float,
    "prepare_p99_ms": float,
    "cpu_ratio_quiet": float,
    "prepare_p99_ms_by_nodes": dict,
    "prepare_p99_ms_kubelet_by_nodes": dict,
    "controller_watch_bytes_by_nodes": dict,
}


@pytest.mark.timeout(300)
def test_the_scale_run_at_a_tiny_size_reports_its_figures() -> None:
    """``--scale`` at 2 nodes, 10 pods a node, 50 foreign claims: the keys and their types
    (the timings are the benchmark's to report); every pod ran and nothing leaked."""
    result = run_bench(
        "dra.py",
        300,
        "--scale",
        "--scale-nodes",
        "2",
        "--pods-per-node",
        "10",
        "--foreign-claims",
        "50",
        "--settle-s",
        "0.5",
        "--idle-s",
        "1",
        "--quiet-pods",
        "2",
        "--noop-calls",
        "40",
        "--json-only",
    )
    assert set(KEYS) <= set(result), sorted(set(KEYS) - set(result))
    for key, kind in SCALE_KEYS.items():
        value = result[key]
        assert isinstance(value, kind) or (kind is float and isinstance(value, int)), (key, value)
    for key in (
        "agent_cpu_ms_per_pod_by_nodes",
        "prepare_p99_ms_by_nodes",
        "prepare_p99_ms_kubelet_by_nodes",
        "controller_watch_bytes_by_nodes",
    ):
        assert set(result[key]) == {"2"}, (key, result[key])
    # Prepare timed in the agents' handler (their histograms), every churn Prepare counted
    assert result["prepare_timed_at"] == "handler", result
    assert result["prepare_calls_by_nodes"]["2"] >= 20, result
    assert isinstance(result["controller_watch_bytes_by_nodes"]["2"], int), result
    assert result["claim_reads_attributed"] is True, result
    assert result["pods"] == result["prepared"] == result["unprepared"] == 20, result
    for key in ("leases_leaked", "wrong_injections", "overcommit", "lost", "quiet_failed"):
        assert result[key] == 0, (key, result[key], result["lost_why"])


def run_bench(script: str, timeout_s: float, *args: str) -> dict[str, Any]:
    """``bench/<script> ARGS`` as a process: it must exit 0; its last line, as JSON."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result
