"""bench/dra.py at its small size (4 nodes, 200 pods, a fifth of them asking only for the
extended resource): every pod bound, prepared, run and gone, and nothing leaked,
overcommitted or run under another claim's lease or limits. The speed, CPU and
slice-write figures are the benchmark's to report, not asserted here."""

from __future__ import annotations

import pytest

from tests.helpers import run_bench_small

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
