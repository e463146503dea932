"""The reliability suite at its CI size: the real agent under load, kill -9 restarts, MPS
daemon kills, a vanished telemetry endpoint, an unwritable store, hostile input, SIGTERM
restarts that keep the MPS daemons and their clients, and the security probes."""

from __future__ import annotations

import pytest

from tests.helpers import run_bench_small


@pytest.mark.timeout(600)
def test_the_small_reliability_run_holds() -> None:
    result = run_bench_small("reliability.py", timeout_s=600)
    assert result["ok"], result
    load, restarts = result["load"], result["restarts"]
    assert load["lost"] == load["duplicated"] == load["invariant_violations"] == 0
    assert load["admitted"] > 100
    assert restarts["lost"] == restarts["duplicated"] == 0
    good, checked = map(int, restarts["retries_same_lease"].split("/"))
    assert good == checked > 0
    assert result["mps"]["refused_while_down"].startswith(str(result["mps"]["mps_kill9"]))
    telemetry = result["telemetry"]
    assert telemetry["telemetry_gone_to_unready_s"] is not None
    assert telemetry["telemetry_back_to_ready_s"] is not None
    unwritable = result["unwritable"]
    if "unwritable_store" not in unwritable:  # skipped where nothing can be mounted
        assert unwritable["unwritable_fails_closed"]
    bad = result["bad_input"]
    assert bad["hostile_requests"] >= 1000
    assert bad["internal_or_unknown"] == bad["crashes"] == 0
    graceful = result["restarts_graceful"]
    assert graceful["jobs"] == 4 and graceful["acknowledged"] > 0
    assert graceful["mps_daemons_replaced"] == graceful["clients_cut_off"] == 0
    security = result["security"]
    assert all(security[k] == 0 for k in (
        "unauthenticated_accepted", "plaintext_token_accepted", "forged_identity_actions",
        "foreign_release_accepted", "world_writable_files",
    ))  # fmt: skip
    assert security["calls"] > 0 and security["foreign_calls"] > 0
