"""A cluster of real node agents in one process: one ``NodeService`` per node (the agent's own
admission, gangs and preemption, with an in-memory SQLite store), whole GPUs as exclusive
devices. The gang and quota experiments place through it, not through a separate model."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from agent.admission.policy import Rules
from agent.core.lease import Lease
from agent.core.types import (
    AdmissionRequest,
    AdmitResult,
    Device,
    PriorityClass,
    SharingMode,
)
from agent.core.units import GIB
from agent.node.events import EventLog
from agent.node.service import NodeService
from agent.state.sqlite import SqliteStateStore

GPU_MEMORY = 80 * GIB
_ids = itertools.count()


class Clock:
    def __init__(self) -> None:
        self.minute = 0.0

    def __call__(self) -> float:
        return self.minute * 60.0


class AgentCluster:
    def __init__(self, nodes: int, gpus: int, clock: Clock) -> None:
        self.clock = clock
        self.nodes: list[NodeService] = []
        self._shape = (nodes, gpus)
        self._stores: list[SqliteStateStore] = []

    async def start(self) -> None:
        nodes, gpus = self._shape
        for n in range(nodes):
            devices = [
                Device(f"GPU-n{n}-{g}", g, "H100", GPU_MEMORY, sharing_mode=SharingMode.EXCLUSIVE)
                for g in range(gpus)
            ]
            store = SqliteStateStore(":memory:", sync="normal")
            await store.start()
            events = EventLog(capacity=1000, clock=self.clock)
            await events.resume(store)
            node = NodeService(
                devices,
                store=store,
                events=events,
                rules=Rules(reserve_bytes=0, context_overhead_bytes=0),
                sizes=[],
                mps_root="/run/gpushare/mps",
                mps_states=lambda: [],
                clock=self.clock,
                reservation_ttl_s=600.0,
            )
            await node.load()
            self.nodes.append(node)
            self._stores.append(store)

    async def aclose(self) -> None:
        for store in self._stores:
            await store.aclose()

    def free_gpus(self, node: int) -> int:
        used = {x.device_uuid for x in self.nodes[node].leases.values()}
        return len(self.nodes[node].devices) - len(used)

    async def take(
        self, node: int, count: int, *, tenant: str, priority: PriorityClass, gang: str | None
    ) -> list[AdmitResult]:
        """``count`` whole GPUs on ``node`` (reserved for ``gang`` when given)."""
        results = []
        for _ in range(count):
            request = AdmissionRequest(
                f"r{next(_ids)}", tenant, "cluster", priority, GPU_MEMORY, 100.0
            )
            results.append(await self.nodes[node].admit(request, gang_id=gang))
        return results

    async def release(self, leases: Sequence[Lease]) -> None:
        for lease in leases:
            node = self.node_of(lease)
            if lease.lease_id in self.nodes[node].leases:
                await self.nodes[node].release(lease.lease_id)

    def node_of(self, lease: Lease) -> int:
        return int(lease.device_uuid.split("-")[1][1:])
