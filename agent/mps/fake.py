"""In-memory MPS manager for the simulated node and tests: daemons that are always up."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agent.core.types import Device, MpsDaemonState, SharingMode


class FakeMpsManager:
    backend = "simulated"

    def __init__(self, *, default_thread_pct: float = 100.0) -> None:
        self._default_thread_pct = default_thread_pct
        self._states: dict[str, MpsDaemonState] = {}

    async def start(self, devices: Sequence[Device]) -> None:
        for device in devices:
            if device.sharing_mode is SharingMode.MPS:
                self._states[device.uuid] = MpsDaemonState(
                    device_uuid=device.uuid,
                    up=True,
                    backend=self.backend,
                    default_thread_pct=self._default_thread_pct,
                )

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        self._states = {
            uuid: MpsDaemonState(uuid, up=False, backend=self.backend, detail="stopped")
            for uuid in self._states
        }

    def states(self) -> list[MpsDaemonState]:
        return list(self._states.values())

    def mark_down(self, device_uuid: str, detail: str) -> None:
        """Test hook: the daemon of ``device_uuid`` is down."""
        self._states[device_uuid] = MpsDaemonState(
            device_uuid, up=False, backend=self.backend, detail=detail
        )
