"""Readiness: does an admitted lease's workload ever show up on its device?

Every ``interval_s`` the watcher collects the processes on each device (the MPS servers'
client lists, and NVML's compute and MPS process lists) and maps each PID to a lease by its
cgroup, checked against the workload the lease was granted for, with the
``GPUSHARE_LEASE_ID`` marker in its environment as a hint only (see
:mod:`agent.control.attribution`): a process naming a lease its cgroup contradicts makes
nothing ready. An admitted lease with a client on its device becomes ``ready``. One still
not ready at its deadline is reported (``lease.not_ready``, policy ``report``) or made
``ineffective`` and its capacity freed (policy ``reclaim``). The ineffective-occupancy ratio
W is the share of the node's device memory held by admitted leases that are not ready.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from agent.control.attribution import ProcessAttributor
from agent.core.errors import GpushareError
from agent.core.lease import Lease, LeaseState
from agent.core.mpsstate import MpsDaemonState
from agent.core.types import Device
from agent.gpu.port import GpuBackend
from agent.node.events import EventLog
from agent.node.service import NodeService

log = logging.getLogger(__name__)


def ineffective_ratio(leases: Sequence[Lease], devices: Sequence[Device]) -> float:
    total = sum(d.memory_bytes for d in devices)
    idle = sum(x.memory_bytes for x in leases if x.state is LeaseState.ADMITTED)
    return idle / total if total else 0.0


class ReadinessWatcher:
    def __init__(
        self,
        node: NodeService,
        *,
        gpu: GpuBackend,
        mps_states: Callable[[], list[MpsDaemonState]],
        events: EventLog,
        clock: Callable[[], float],
        policy: str,
        interval_s: float,
        attributor: ProcessAttributor | None = None,
    ) -> None:
        self._node = node
        self.attributor = attributor or ProcessAttributor(events)
        self._gpu = gpu
        self._mps_states = mps_states
        self._events = events
        self._clock = clock
        self._policy = policy
        self._interval_s = interval_s
        self._reported: set[str] = set()

    async def run(self) -> None:
        """Check readiness until cancelled (a supervised task)."""
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.check_once()
            except GpushareError as exc:
                log.warning("readiness check failed: %s", exc)

    async def _pids_by_device(self) -> dict[str, set[int]]:
        pids: dict[str, set[int]] = {uuid: set() for uuid in self._node.devices}
        for daemon in self._mps_states():
            for server in daemon.servers:
                pids.setdefault(daemon.device_uuid, set()).update(server.client_pids)
        for uuid, device in self._node.devices.items():
            pids[uuid].update(p.pid for p in await self._gpu.processes(device))
        return pids

    async def check_once(self) -> list[str]:
        """One pass; returns what it did, for logs and tests."""
        by_device = await self._pids_by_device()
        owners = await self.attributor.owners(
            {pid for pids in by_device.values() for pid in pids}, self._node.leases.values()
        )
        seen: dict[str, list[int]] = {}
        for uuid, pids in by_device.items():
            for pid in pids:
                lease = self._node.leases.get(owners.get(pid) or "")
                if lease is not None and lease.device_uuid == uuid:
                    seen.setdefault(lease.lease_id, []).append(pid)
        return await self._apply(seen)

    async def _apply(self, seen: dict[str, list[int]]) -> list[str]:
        actions = []
        now = self._clock()
        admitted = [x for x in self._node.leases.values() if x.state is LeaseState.ADMITTED]
        for lease in admitted:
            if lease.lease_id in seen:
                await self._node.mark_ready(lease, sorted(seen[lease.lease_id]))
                actions.append(f"ready {lease.lease_id}")
            elif lease.ready_deadline_at is not None and now >= lease.ready_deadline_at:
                actions.append(await self._overdue(lease))
        return actions

    async def _overdue(self, lease: Lease) -> str:
        if self._policy == "reclaim" and not lease.held_by_claim:
            await self._node.mark_ineffective(lease)
            return f"ineffective {lease.lease_id}"
        if lease.lease_id not in self._reported:
            self._reported.add(lease.lease_id)
            self._events(
                "lease.not_ready",
                f"lease {lease.lease_id} has no client on its device past its readiness deadline",
                device_uuid=lease.device_uuid,
                lease_id=lease.lease_id,
            )
        return f"not ready {lease.lease_id}"
