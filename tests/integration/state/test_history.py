"""Every lease that ends leaves a history row with its nine admission-time attributes and
whether (and how soon) it became ready; an older database is migrated in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.core.lease import HISTORY_ATTRIBUTES, LeaseState
from agent.core.types import AdmissionRequest, JobAttributes, PriorityClass
from agent.core.units import GIB
from agent.state.migrations import MIGRATIONS
from agent.state.sqlite import SqliteStateStore
from tests.integration.state.test_ledger_edges import open_node


async def test_ended_leases_leave_history_rows_with_their_attributes(tmp_path: Path) -> None:
    node, store, _events = await open_node(tmp_path)
    try:
        job = JobAttributes("inference", "llm", True, 2.5, 3600.0, 42.0)
        first = await node.admit(
            AdmissionRequest("r-1", "t", "a", PriorityClass.GUARANTEED, 4 * GIB, 25.0, job=job)
        )
        second = await node.admit(
            AdmissionRequest("r-2", "t", "a", PriorityClass.BEST_EFFORT, 4 * GIB, 10.0)
        )
        assert first.lease is not None and second.lease is not None
        ready = await node.mark_ready(first.lease, [4321])
        await node.release(ready.lease_id)
        await node.mark_ineffective(second.lease)
        rows = {row.lease_id: row for row in await store.history()}
    finally:
        await store.aclose()
    served, idle = rows[first.lease.lease_id], rows[second.lease.lease_id]
    assert tuple(served.attributes) == HISTORY_ATTRIBUTES
    assert served.attributes == {
        "accelerator_model": "H100",
        "priority": "guaranteed",
        "job_type": "inference",
        "model_type": "llm",
        "generative": 1.0,
        "requested_gpus": 2.5,
        "declared_duration_s": 3600.0,
        "scheduling_delay_s": 42.0,
        "concurrent_requests": 0.0,
    }
    assert served.final_state == LeaseState.RELEASED.value and served.became_ready
    assert served.ready_after_s is not None and 0 <= served.ready_after_s < 5
    assert idle.final_state == LeaseState.INEFFECTIVE.value and not idle.became_ready
    assert idle.ready_after_s is None
    assert idle.attributes["requested_gpus"] == 0.1, "its share of one device"
    assert idle.attributes["concurrent_requests"] == 1.0


async def test_a_database_of_schema_4_is_migrated_and_keeps_its_leases(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for version, script in enumerate(MIGRATIONS[:4], start=1):
        db.executescript(f"BEGIN; {script}; INSERT INTO schema_version VALUES ({version}); COMMIT;")
    db.execute(
        "INSERT INTO leases (lease_id, request_id, tenant, trust_domain, device_uuid, priority, "
        "memory_bytes, thread_pct, state, created_at, updated_at) "
        "VALUES ('l-old', 'r-old', 't', 'a', 'GPU-0', 'burstable', 1073741824, 10, 'ready', 1, 2)"
    )
    db.close()
    store = SqliteStateStore(str(path))
    await store.start()
    try:
        (lease,) = await store.live_leases()
    finally:
        await store.aclose()
    assert lease.lease_id == "l-old" and lease.attributes == {} and lease.ready_at is None
