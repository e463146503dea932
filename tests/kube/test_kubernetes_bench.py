"""bench/kubernetes.py at its small size (4 nodes, 200 pods): every pod bound, run and
gone, and nothing leaked, overcommitted or run under another pod's lease; with API faults
and agents killed mid-bind too, no pod runs without its lease and none that exists is left
unstarted. The speed figures are the benchmark's to report, not asserted here."""

from __future__ import annotations

import pytest

from tests.helpers import run_bench_small

KEYS = (
    "pods",
    "bound",
    "pods_per_s",
    "bind_p50_ms",
    "bind_p99_ms",
    "admit_p50_ms",
    "leases_leaked",
    "wrong_lease_injections",
    "overcommit",
    "running_without_lease",
    "pods_never_started",
    "lost",
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "extra",
    [
        pytest.param((), id="device plugin, scheduler in the harness"),
        pytest.param(
            ("--injector", "nri", "--scheduler", "process", "--scheduling-cycles", "1"),
            id="NRI, scheduler in its own process",
        ),
    ],
)
def test_the_small_kubernetes_run_binds_every_pod_and_leaks_nothing(extra: tuple[str, ...]) -> None:
    result = run_bench_small("kubernetes.py", 300, *extra)
    assert set(KEYS) <= set(result), sorted(set(KEYS) - set(result))
    assert result["pods"] == result["bound"] == 200, result
    assert result["leases_leaked"] == 0, result
    assert result["wrong_lease_injections"] == 0, result
    assert result["overcommit"] == 0, result
    assert result["gangs"] > 0 and result["gangs_partial"] == 0, result
    assert result["admit_samples"] > 0 and result["ledger_samples"] > 0, result
    if "nri" in extra:  # a pod evicted before its container: refused at CreateContainer
        assert result["mismatches_refused"] <= result["evicted"], result
    else:
        assert result["mismatches_refused"] == 0, result
    assert result["lost"] == 0, result
    cpu = result["cpu_ms_per_pod"]
    assert {"agents", "cluster_side", "harness", "all"} <= set(cpu), cpu
    assert cpu["agents"] > 0 and cpu["cluster_side"] > 0, cpu  # every part was counted
    assert cpu["all"] >= cpu["agents"] + cpu["cluster_side"] + cpu["harness"] - 0.2, cpu
    assert result["cores_busy"] > 0, result


@pytest.mark.timeout(300)
def test_the_small_run_with_api_faults_and_agents_killed_keeps_every_promise() -> None:
    result = run_bench_small(
        "kubernetes.py", 300, "--faults", "0.1", "--kill-agents", "2", "--kill-every-s", "3"
    )
    assert result["pods"] == result["bound"] == 200, result
    faults = result["faults"]
    assert faults["agents_killed_mid_bind"] == 2, faults
    answered = faults["answered"]
    assert any(k.startswith("binding ") for k in answered), faults
    assert any(k.startswith("patch ") for k in answered), faults
    why = {
        k: result[k] for k in ("leaked", "lost_why", "refused_why", "rejected_agent_away", "faults")
    }
    for key in (
        "leases_leaked",
        "running_without_lease",
        "pods_never_started",
        "wrong_lease_injections",
        "overcommit",
        "mismatches_refused",
        "lost",
    ):
        assert result[key] == 0, (key, result[key], why)
    assert result["gangs_partial"] == 0, result
