"""Whether each device takes new leases now, and why not: the store cannot write, an
operator drained it, a control loop closed it (fault, degradation), or its MPS control
daemon is down.

A drain or undrain of a device is one unit: the store's row, then the in-memory set and
the event; a caller that goes away in between (Ctrl-C, a deadline) does not leave a
device drained on disk and open in memory (:func:`agent.aio.section.run_to_end`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agent.aio.section import run_to_end
from agent.core.errors import NotFoundError
from agent.core.mpsstate import MpsDaemonState
from agent.core.types import Device, ReasonCode, SharingMode
from agent.node.events import EventLog
from agent.state.port import StateStore

# why a control loop closed a device (Device.closed_detail), and the events that close one
GONE_DETAIL = "the device is gone from the node"
LOST_DETAIL = "NVML reports the GPU lost"  # its GPU-lost event, or XID 79
FAULT_EVENTS = ("mps.server_fatal", "gpu.xid", "gpu.ecc_double_bit", "gpu.fatal_poison")


class Availability:
    def __init__(
        self,
        devices: Mapping[str, Device],
        *,
        store: StateStore,
        events: EventLog,
        clock: Callable[[], float],
    ) -> None:
        self._devices = devices
        self._store = store
        self._events = events
        self._clock = clock
        self.drained: dict[str, str] = {}
        self._closures: dict[str, dict[str, tuple[ReasonCode, str]]] = {}

    async def load(self) -> None:
        stored = await self._store.drained()
        self.drained = {u: r for u, r in stored.items() if u in self._devices}

    def closed(
        self, device: Device, daemon: MpsDaemonState | None
    ) -> tuple[ReasonCode | None, str]:
        gone = self._closures.get(device.uuid, {}).get("gone")
        if gone is not None:  # first: a GPU that is gone is tainted NoExecute, whatever else
            return gone
        if not self._store.writable():
            return ReasonCode.STORE_UNAVAILABLE, "the state store cannot write: failing closed"
        if device.uuid in self.drained:
            return ReasonCode.DRAINING, f"drained: {self.drained[device.uuid]}"
        for reason, detail in self._closures.get(device.uuid, {}).values():
            return reason, detail
        if device.sharing_mode is SharingMode.MPS and (daemon is None or not daemon.up):
            why = daemon.detail if daemon is not None else "no daemon"
            return ReasonCode.DEVICE_UNAVAILABLE, f"MPS control daemon is down ({why})"
        if device.sharing_mode is SharingMode.MPS and daemon is not None and not daemon.answering:
            why = daemon.detail or "a probe went unanswered"
            return ReasonCode.DEVICE_UNAVAILABLE, f"MPS control daemon does not answer ({why})"
        return None, ""

    def close(self, device_uuid: str, source: str, reason: ReasonCode, detail: str) -> None:
        """Close a device to new leases on behalf of a control loop (``source``)."""
        self._closures.setdefault(device_uuid, {})[source] = (reason, detail)

    def reopen(self, device_uuid: str, source: str) -> None:
        self._closures.get(device_uuid, {}).pop(source, None)

    async def drain(self, device_uuid: str | None, reason: str) -> list[str]:
        targets = self._targets(device_uuid)
        for uuid in targets:
            await run_to_end(self._drain_one(uuid, reason or "drained"), what=f"drain of {uuid}")
        return targets

    async def _drain_one(self, uuid: str, reason: str) -> None:
        await self._store.set_drained(uuid, reason, at=self._clock())
        self.drained[uuid] = reason
        self._events("device.drained", f"closed to new leases: {reason}", device_uuid=uuid)

    async def undrain(self, device_uuid: str | None) -> list[str]:
        targets = [u for u in self._targets(device_uuid) if u in self.drained]
        for uuid in targets:
            await run_to_end(self._undrain_one(uuid), what=f"undrain of {uuid}")
        return targets

    async def _undrain_one(self, uuid: str) -> None:
        await self._store.set_drained(uuid, None, at=self._clock())
        self.drained.pop(uuid, None)
        self._events("device.undrained", "open to new leases again", device_uuid=uuid)

    def _targets(self, device_uuid: str | None) -> list[str]:
        if not device_uuid:
            return list(self._devices)
        if device_uuid not in self._devices:
            shown = device_uuid if len(device_uuid) <= 64 else device_uuid[:64] + "…"
            raise NotFoundError(f"no device {shown!r} on this node")
        return [device_uuid]
