"""Readiness: does an admitted lease's workload ever show up on its device?

Every ``interval_s`` the watcher collects the processes on each device (the MPS servers'
client lists, and NVML's compute and MPS process lists) and maps each PID to a lease through
the lease marker in its environment (``/proc/<pid>/environ``, variable
``GPUSHARE_LEASE_ID``), falling back to a lease id in its cgroup path. An admitted lease with
a client on its device becomes ``ready``. One still not ready at its deadline is reported
(``lease.not_ready``, policy ``report``) or made ``ineffective`` and its capacity freed
(policy ``reclaim``). The ineffective-occupancy ratio W is the share of the node's device
memory held by admitted leases that are not ready.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence

import psutil

from agent.core.errors import GpushareError
from agent.core.lease import Lease, LeaseState
from agent.core.types import Device, MpsDaemonState
from agent.gpu.port import GpuBackend
from agent.mps.limits import LEASE_MARKER_VAR
from agent.runtime.events import EventLog
from agent.runtime.node import NodeService

log = logging.getLogger(__name__)
_CGROUP_LEASE = re.compile(r"(l-[A-Za-z0-9_-]{16})")


def lease_marker(pid: int) -> str | None:
    """The lease a process belongs to, from its environment or else its cgroup."""
    try:
        marker = psutil.Process(pid).environ().get(LEASE_MARKER_VAR)
    except psutil.Error:
        marker = None
    if marker:
        return marker
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            match = _CGROUP_LEASE.search(f.read())
    except OSError:
        return None
    return match.group(1) if match else None


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
    ) -> None:
        self._node = node
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
        markers = await asyncio.to_thread(
            lambda: {pid: lease_marker(pid) for pids in by_device.values() for pid in pids}
        )
        seen: dict[str, list[int]] = {}
        for uuid, pids in by_device.items():
            for pid in pids:
                lease_id = markers.get(pid)
                lease = self._node.leases.get(lease_id or "")
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
        if self._policy == "reclaim":
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
