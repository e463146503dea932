"""A real SQLite store whose writes a test can hold (the sync takes as long as the test
wants) or fail, and a node over it (on a fake clock: :func:`clocked_node`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from agent.admission.policy import Rules
from agent.core.errors import StateError
from agent.core.mpsstate import MpsDaemonState
from agent.core.types import AdmissionRequest, Device, PriorityClass
from agent.core.units import GIB
from agent.node.events import EventLog
from agent.node.service import NodeService
from agent.state.sqlite import SqliteStateStore
from tests.helpers import FakeClock

DEVICE = Device("GPU-0", 0, "H100", 80 * GIB)
RULES = Rules(reserve_bytes=0, context_overhead_bytes=0)


class ControlledStore(SqliteStateStore):
    """Writes wait while ``held`` (on the store's thread, like a slow disk) and the next
    ``fail_writes`` of them fail, as a full disk does."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.open = threading.Event()
        self.open.set()
        self.fail_writes = 0
        self.writes = 0

    def hold(self) -> None:
        self.open.clear()

    def release(self) -> None:
        self.open.set()

    def _write(self, *args):  # type: ignore[no-untyped-def]
        self.open.wait(timeout=10)
        self.writes += 1
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise StateError("disk full (injected)")
        return super()._write(*args)


async def open_node(
    path: Path,
    *,
    clock: Callable[[], float] = time.time,
    devices: tuple[Device, ...] = (DEVICE,),
    rules: Rules = RULES,
) -> tuple[NodeService, ControlledStore, EventLog]:
    store = ControlledStore(str(path / "state.db"))
    await store.start()
    events = EventLog(clock=clock)
    await events.resume(store)
    node = NodeService(
        list(devices),
        store=store,
        events=events,
        rules=rules,
        sizes=[],
        mps_root="/run/mps",
        mps_states=lambda: [MpsDaemonState(d.uuid, True, "x") for d in devices],
        clock=clock,
        reservation_ttl_s=30,
    )
    await node.load()
    return node, store, events


Setup = tuple[NodeService, ControlledStore, EventLog, FakeClock]


@contextlib.asynccontextmanager
async def clocked_node(path: Path) -> AsyncIterator[Setup]:
    """:func:`open_node` on a fake clock, and the clock; after, the store's writes let go
    and the store closed."""
    clock = FakeClock()
    node, store, events = await open_node(path, clock=clock)
    try:
        yield node, store, events, clock
    finally:
        store.release()
        await store.aclose()


def request(
    request_id: str,
    memory_gib: float,
    priority: PriorityClass = PriorityClass.BURSTABLE,
    *,
    tenant: str = "t",
    thread_pct: float = 10.0,
    run_as_uid: int | None = None,
) -> AdmissionRequest:
    return AdmissionRequest(
        request_id,
        tenant,
        "a",
        priority,
        int(memory_gib * GIB),
        thread_pct,
        run_as_uid=run_as_uid,
    )


Ledger = tuple[NodeService, ControlledStore, EventLog]


async def settle() -> None:
    """A few turns of the loop with time for the store's thread: calls reach their wait."""
    for _ in range(5):
        await asyncio.sleep(0.02)
