"""The run-record writer under cancellation and store faults: a write whose caller is
cancelled while it runs (a stop) is settled by the next flush, so its records are neither
lost nor written twice; a refused write keeps its records, in order, for the next one."""

from __future__ import annotations

import asyncio

import pytest

from agent.core.errors import StateError
from agent.estimator.records import Workload
from agent.learning.progress import ProgressTracker
from agent.learning.runrecords import RunRecorder
from agent.node.ledger import Ledger
from agent.state.port import RunRecordRow


class HeldStore:
    """A store whose writes wait to be released, and may fail (before or after landing)."""

    def __init__(self) -> None:
        self.rows: list[RunRecordRow] = []
        self.release = asyncio.Event()
        self.fail_next: str = ""  # "refused": nothing lands; "landed": lands, then raises

    async def add_run_records(self, rows: list[RunRecordRow]) -> None:
        await self.release.wait()
        how, self.fail_next = self.fail_next, ""
        if how == "refused":
            raise StateError("disk full")
        self.rows.extend(rows)
        if how == "landed":
            raise StateError("the answer was lost")


def recorder(store: HeldStore, rows: int) -> RunRecorder:
    tracker = ProgressTracker(
        clock=lambda: 0.0, min_span_s=1.0, workload_of=lambda x: Workload("w", 100, 0)
    )
    made = RunRecorder(
        tracker,
        store=store,  # type: ignore[arg-type]
        devices=[],
        ledger=Ledger([]),
        clock=lambda: 0.0,
    )
    made._unwritten = [RunRecordRow(float(i), "f", f"r{i}") for i in range(rows)]
    return made


async def test_a_write_whose_caller_is_cancelled_is_neither_lost_nor_doubled() -> None:
    store = HeldStore()
    made = recorder(store, 3)
    caller = asyncio.create_task(made.flush())
    await asyncio.sleep(0.01)
    caller.cancel()  # the writer task, cancelled at a stop, mid-write
    with pytest.raises(asyncio.CancelledError):
        await caller
    made._unwritten.append(RunRecordRow(9.0, "f", "r9"))  # made after the cancel
    store.release.set()
    assert await made.flush()  # flush_at_stop: settles the first write, then the rest
    assert [r.record for r in store.rows] == ["r0", "r1", "r2", "r9"]


@pytest.mark.parametrize("how", ["refused", "landed"])
async def test_a_failed_write_keeps_its_records_in_order(how: str) -> None:
    store = HeldStore()
    store.release.set()
    store.fail_next = how
    made = recorder(store, 2)
    assert not await made.flush()
    assert [r.record for r in made._unwritten] == ["r0", "r1"], "kept, in front"
    assert await made.flush()
    # a write that landed before its error is written again: its rows are in twice
    expected = ["r0", "r1"] if how == "refused" else ["r0", "r1", "r0", "r1"]
    assert [r.record for r in store.rows] == expected
