"""Applies the w-window degradation rule (``agent.admission.degradation``) as windows close.

The sampler hands over each device's window as it closes; the monitor estimates every
protected lease's retention from the window's counters (``ProfileGate.estimate_live``),
advances the rule and acts: a degraded device is closed to new leases
(``DEVICE_DEGRADED``), an eviction ends the victim's clients (``terminate_client``) and
then its lease (``evicted``), a recovery reopens the device. A window that closes more than
``stale_after_s`` late is stale telemetry: the rule pauses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Protocol

from agent.admission.degradation import DegradationRule, DeviceHealth, Step, step
from agent.admission.policy import DeviceView
from agent.control.janitor import terminate_clients
from agent.core.errors import GpushareError
from agent.core.lease import Lease, LeaseState
from agent.core.samples import WindowSample
from agent.core.types import ReasonCode
from agent.mps.port import MpsManager
from agent.mps.stale import clients_on
from agent.node.events import EventLog
from agent.node.service import NodeService

log = logging.getLogger(__name__)


class LiveGate(Protocol):
    """What the monitor asks of the retention gate (``agent.learning.gate.ProfileGate``)."""

    def estimate_live(
        self, view: DeviceView, measured: Mapping[str, float]
    ) -> dict[str, float]: ...

    def floor_of(self, profile: str | None, stated: float | None) -> float | None: ...


class DegradationMonitor:
    def __init__(
        self,
        node: NodeService,
        *,
        gate: LiveGate,
        mps: MpsManager,
        events: EventLog,
        rule: DegradationRule,
        clock: Callable[[], float],
        stale_after_s: float,
        actions: Counter[str],
    ) -> None:
        self._node = node
        self._gate = gate
        self._mps = mps
        self._events = events
        self._rule = rule
        self._clock = clock
        self._stale_after_s = stale_after_s
        self.actions = actions
        self.health: dict[str, DeviceHealth] = {}
        self._windows: asyncio.Queue[WindowSample] = asyncio.Queue()

    def on_window(self, window: WindowSample) -> None:
        """The sampler's listener: called as each device's window closes."""
        self._windows.put_nowait(window)

    async def run(self) -> None:
        """Step the rule for each closed window, in order (a supervised task)."""
        while True:
            window = await self._windows.get()
            try:
                await self.step(window)
            except GpushareError as exc:
                log.warning("degradation step on %s failed: %s", window.device_uuid, exc)
            finally:
                self._windows.task_done()

    async def settled(self) -> None:
        """Wait until every window handed over so far has been stepped (for tests)."""
        await self._windows.join()

    def degraded(self) -> list[str]:
        return sorted(uuid for uuid, h in self.health.items() if h.degraded)

    async def step(self, window: WindowSample) -> Step:
        uuid = window.device_uuid
        view = next((v for v in self._node.views() if v.device.uuid == uuid), None)
        if view is None:
            return Step(DeviceHealth(), reason="unknown device")
        leases = [self._with_floor(x) for x in view.leases]
        late_s = self._clock() - (window.start_at + window.window_s)
        estimates = (
            None if late_s > self._stale_after_s else self._gate.estimate_live(view, window.mean)
        )
        result = step(self._rule, self.health.get(uuid, DeviceHealth()), leases, estimates)
        self.health[uuid] = result.health
        await self._act(uuid, result)
        return result

    def _with_floor(self, lease: Lease) -> Lease:
        floor = self._gate.floor_of(lease.profile, lease.retention_floor)
        return dataclasses.replace(lease, retention_floor=floor)

    async def _act(self, uuid: str, result: Step) -> None:
        if result.became_degraded:
            self._count("degrade", f"device degraded: {result.reason}", uuid)
            self._node.close(uuid, "degraded", ReasonCode.DEVICE_DEGRADED, result.reason)
        if result.recovered:
            self._count("recover", f"device recovered: {result.reason}", uuid)
            self._node.reopen(uuid, "degraded")
        if result.evict is not None:
            await self._evict(uuid, result.evict, result.reason)

    async def _evict(self, uuid: str, lease_id: str, reason: str) -> None:
        self._count("evict", f"evicting lease {lease_id}: {reason}", uuid, lease_id)
        lease = self._node.leases.get(lease_id)
        pids = set(lease.client_pids) if lease is not None else set()
        await terminate_clients(
            self._mps, uuid, clients_on(self._mps.states(), uuid, pids.__contains__)
        )
        await self._node.end_leases([lease_id], LeaseState.EVICTED, f"device degraded: {reason}")

    def _count(self, kind: str, message: str, uuid: str, lease_id: str | None = None) -> None:
        log.warning("%s (%s)", message, uuid)
        self.actions[kind] += 1
        self._events(f"degradation.{kind}", message, device_uuid=uuid, lease_id=lease_id)
