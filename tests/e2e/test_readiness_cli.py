"""`gpushare readiness` by hand: synthetic jobs in ASI columns, grouped evaluation against
the lookup baselines, training, and training from the agent's own lease history."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from agent.core.lease import Lease, LeaseState
from agent.core.types import PriorityClass
from agent.estimator.readiness import ReadinessModel
from agent.state.port import WriteBatch
from agent.state.sqlite import SqliteStateStore
from tests.helpers import agent_command, subprocess_env


def gpushare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_command(*args),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_predictor_beats_both_lookups_on_held_out_machines(tmp_path: Path) -> None:
    data = tmp_path / "jobs.csv"
    made = gpushare("readiness", "synth", "--out", str(data), "--jobs", "6000", "--seed", "7")
    assert made.returncode == 0, made.stderr
    report = gpushare("readiness", "evaluate", "--csv", str(data), "--json", "--trees", "40")
    assert report.returncode == 0, report.stderr
    result = json.loads(report.stdout)
    assert result["grouped_by_machine"] and result["machines"] >= 100
    methods = result["methods"]
    assert methods["predictor"]["roc_auc"] > methods["model-x-job"]["roc_auc"]
    assert methods["predictor"]["roc_auc"] > methods["job-x-duration"]["roc_auc"]
    assert 0.0 <= methods["predictor"]["ece"] < 0.1
    table = gpushare("readiness", "evaluate", "--csv", str(data), "--trees", "20")
    assert "predictor" in table.stdout and "grouped by machine" in table.stdout

    out = tmp_path / "model"
    trained = gpushare("readiness", "train", "--csv", str(data), "--out", str(out))
    assert trained.returncode == 0, trained.stderr
    assert ReadinessModel.load(out).metadata["rows"] == 6000


def ended(i: int) -> Lease:
    ready = i % 3 != 0
    return Lease(
        f"l-{i:016d}",
        f"r-{i}",
        "t",
        "a",
        "GPU-0",
        PriorityClass.BURSTABLE,
        2**30,
        10.0,
        LeaseState.RELEASED if ready else LeaseState.INEFFECTIVE,
        0.0,
        100.0,
        ready_at=5.0 if ready else None,
        attributes={
            "accelerator_model": "H100",
            "priority": "burstable",
            "job_type": "dev" if not ready else "training",
            "model_type": "",
            "generative": 0.0,
            "requested_gpus": 0.1,
            "declared_duration_s": 0.0,
            "scheduling_delay_s": float(i),
            "concurrent_requests": 1.0,
        },
    )


def test_training_from_the_agents_own_history(tmp_path: Path) -> None:
    db = tmp_path / "gpushare.db"

    async def fill() -> None:
        store = SqliteStateStore(str(db))
        await store.start()
        await store.commit(WriteBatch(leases=[ended(i) for i in range(90)]))
        await store.aclose()

    asyncio.run(fill())
    report = gpushare("readiness", "evaluate", "--history-db", str(db), "--folds", "3")
    assert report.returncode == 0, report.stderr
    assert "NOT grouped (one machine)" in report.stdout and "90 rows" in report.stdout
    trained = gpushare("readiness", "train", "--history-db", str(db), "--out", str(tmp_path / "m"))
    assert trained.returncode == 0 and "90 rows, 60 ready" in trained.stdout
    missing = gpushare("readiness", "train", "--history-db", str(tmp_path / "no.db"), "--out", "x")
    assert missing.returncode == 2 and "no such state database" in missing.stderr
