"""The janitor: clears stale MPS contexts, periodically and on demand (``ClearStale``).

Each pass gathers facts (the daemons' client lists, each PID's process state and the lease
its cgroup says it belongs to, see :mod:`agent.control.attribution`, NVML's per-process
device memory, faults seen since the last pass), asks the pure planner (``agent.mps.stale``)
what to do, and does it. Every action is an event, a count in
``gpushare_control_actions_total`` and a log line; a dry run lists the same actions and
changes nothing; a report terminates nothing. A hung control daemon is the MPS supervisor's
to restart; a pass lists it. Each pass keeps the used memory it summed per lease for the
per-lease metrics (``gpushare_lease_memory_used_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable

import psutil

from agent.control.attribution import ProcessAttributor
from agent.core.errors import GpuError, GpushareError
from agent.core.lease import LeaseState
from agent.core.types import Event, ReasonCode
from agent.gpu.port import GpuBackend
from agent.mps.port import MpsManager
from agent.mps.stale import (
    Action,
    ActionKind,
    Facts,
    Memory,
    Policy,
    ProcessFact,
    ProcessState,
    plan,
)
from agent.node.availability import FAULT_EVENTS, GONE_DETAIL, LOST_DETAIL
from agent.node.events import EventLog
from agent.node.service import NodeService

log = logging.getLogger(__name__)


def lost(event: Event) -> bool:
    """NVML says the GPU is lost: its unavailable-error event, or XID 79 (fallen off the
    bus). The device is closed as gone (its slice device tainted NoExecute) until the
    agent restarts, or until the presence check sees it listed again after it went
    unlisted. Its leases are failed by the presence check once it is no longer listed."""
    return event.kind == "gpu.unavailable" or (
        event.kind == "gpu.xid" and str(event.attrs.get("data", "")) == "79"
    )


def process_states(pids: Iterable[int]) -> dict[int, ProcessState]:
    """Each PID's state (blocking: reads /proc)."""
    states = {}
    for pid in set(pids):
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            states[pid] = ProcessState.GONE
            continue
        except psutil.Error:
            status = psutil.STATUS_RUNNING  # not ours to read: alive, unknown lease
        states[pid] = ProcessState.ZOMBIE if status == psutil.STATUS_ZOMBIE else ProcessState.ALIVE
    return states


class Janitor:
    def __init__(
        self,
        node: NodeService,
        *,
        mps: MpsManager,
        gpu: GpuBackend,
        events: EventLog,
        clock: Callable[[], float],
        policy: Policy,
        interval_s: float,
        actions: Counter[str],
        attributor: ProcessAttributor | None = None,
    ) -> None:
        self._node = node
        self.attributor = attributor or ProcessAttributor(events)
        self._mps = mps
        self._gpu = gpu
        self._events = events
        self._clock = clock
        self._policy = policy
        self._interval_s = interval_s
        self._memory = Memory()
        self._faults: dict[str, str] = {}
        self._gone: set[str] = set()  # devices no longer listed by the GPU backend
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self.actions = actions
        # NVML's used memory of each lease's processes, summed, as of the last pass (metrics)
        self.memory_used_bytes: dict[str, int] = {}
        events.listeners.append(self._on_event)

    def _on_event(self, event: Event) -> None:
        uuid = event.device_uuid
        if lost(event) and uuid is not None and uuid in self._node.devices:
            self._node.close(uuid, "gone", ReasonCode.DEVICE_UNAVAILABLE, LOST_DETAIL)
        if event.kind in FAULT_EVENTS and uuid is not None and uuid in self._node.devices:
            what = f"{event.kind}: {event.message}"
            self._faults.setdefault(uuid, what)
            self._node.close(uuid, "fault", ReasonCode.DEVICE_UNAVAILABLE, what)
            self._wake.set()

    async def run(self) -> None:
        """A pass every ``interval_s``, and at once after a fault (a supervised task)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._interval_s)
            self._wake.clear()
            try:
                await self.pass_once(dry_run=False)
            except GpushareError as exc:
                log.warning("janitor pass failed: %s", exc)

    async def pass_once(self, *, dry_run: bool) -> list[str]:
        """One pass; what it did (or, with ``dry_run``, would do)."""
        async with self._lock:
            if not dry_run:
                await self._check_presence()
            facts = await self._facts()
            actions, memory = plan(facts, self._memory, self._policy)
            listed = [a.description for a in actions]
            listed += [
                f"control daemon of {d.device_uuid} is down ({d.detail}): the MPS "
                "supervisor restarts it"
                for d in facts.daemons
                if not d.up
            ]
            listed += await self._node.clear_stale(dry_run=dry_run)
            if dry_run:
                return listed
            self._memory = memory
            for action in actions:
                await self._apply(action)
            return listed

    async def _check_presence(self) -> None:
        """A device gone from the node at run time (a GPU off the bus, MIG repartitioned)
        is closed to new leases and its leases are failed; one listed again reopens."""
        try:
            present = {d.uuid for d in await self._gpu.list_devices()}
        except GpuError as exc:
            log.warning("janitor: cannot list the devices: %s", exc)
            return
        gone = set(self._node.devices) - present
        for uuid in sorted(gone - self._gone):
            log.error("device %s is gone from the node: closed, its leases failed", uuid)
            self._node.close(uuid, "gone", ReasonCode.DEVICE_UNAVAILABLE, GONE_DETAIL)
            self._events(
                "device.gone", f"{GONE_DETAIL}: closed, its leases failed", device_uuid=uuid
            )
        for uuid in sorted(self._gone - gone):
            self._node.reopen(uuid, "gone")
            self._events("device.back", "listed again: open to new leases", device_uuid=uuid)
        self._gone = gone
        if gone:
            await self._node.fail_leases_of_gone_devices(gone)

    async def _facts(self) -> Facts:
        await self._mps.refresh()
        daemons = self._mps.states()
        nvml = {
            uuid: await self._gpu.processes(device)
            for uuid, device in self._node.devices.items()
            if uuid not in self._gone
        }
        pids = [c for d in daemons for s in d.servers for c in s.client_pids]
        pids += [p.pid for listed in nvml.values() for p in listed]
        processes = await self._process_facts(pids)
        used: Counter[str] = Counter()
        for listed in nvml.values():
            for p in listed:
                lease_id = processes[p.pid].lease_id
                if lease_id and p.used_memory_bytes is not None:
                    used[lease_id] += p.used_memory_bytes
        self.memory_used_bytes = dict(used)
        return Facts(
            now=self._clock(),
            daemons=daemons,
            leases=list(self._node.leases.values()),
            processes=processes,
            faults=dict(self._faults),
            memory_used=dict(used),
        )

    async def _process_facts(self, pids: list[int]) -> dict[int, ProcessFact]:
        """Each PID's state and, for a live one, the lease it belongs to."""
        states = await asyncio.to_thread(process_states, pids)
        alive = [pid for pid, state in states.items() if state is ProcessState.ALIVE]
        owners = await self.attributor.attribute(alive, self._node.leases.values())
        return {
            pid: ProcessFact(state, owners[pid].lease_id, owners[pid].by_cgroup)
            if pid in owners
            else ProcessFact(state)
            for pid, state in states.items()
        }

    async def _apply(self, action: Action) -> None:
        log.info("janitor: %s", action.description)
        self.actions[action.kind.value] += 1
        device = action.device_uuid
        lease_id = action.lease_ids[0] if len(action.lease_ids) == 1 else None
        self._events(
            f"janitor.{action.kind.value}",
            action.description,
            device_uuid=device,
            lease_id=lease_id,
        )
        if action.kind is ActionKind.RELEASE:
            await self._node.end_leases(
                action.lease_ids, LeaseState.RELEASED, "all its processes exited"
            )
        elif action.kind is ActionKind.FAIL_DEVICE:
            assert device is not None
            await self._node.end_leases(
                action.lease_ids, LeaseState.FAILED, self._faults.get(device, "fault")
            )
        if action.kind is not ActionKind.REPORT_UNKNOWN:  # a report names its client only
            await self._terminate(device, action.clients)
        if action.kind is ActionKind.FAIL_DEVICE:
            assert device is not None
            for server in action.server_pids:
                await self._quietly(self._mps.shutdown_server(device, server), f"server {server}")
            self._faults.pop(device, None)
            self._node.reopen(device, "fault")
            self._events("device.fault_cleared", "open to new leases again", device_uuid=device)

    async def _terminate(self, device: str | None, clients: tuple[tuple[int, int], ...]) -> None:
        if device is not None:
            await terminate_clients(self._mps, device, clients)

    async def _quietly(self, step: Awaitable[None], what: str) -> None:
        try:
            await step
        except GpushareError as exc:
            log.warning("janitor could not act on %s: %s", what, exc)


async def terminate_clients(
    mps: MpsManager, device_uuid: str, clients: Iterable[tuple[int, int]]
) -> None:
    """``terminate_client`` for each (server, client); a failure is logged, not raised."""
    for server, client in clients:
        try:
            await mps.terminate_client(device_uuid, server, client)
        except GpushareError as exc:
            log.warning("could not terminate client %d of server %d: %s", client, server, exc)
