"""Port of the MPS domain: the node's MPS control daemons as one service."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agent.core.types import Device, MpsDaemonState


class MpsManager(Protocol):
    """Starts, watches and stops one MPS control daemon per shared device."""

    backend: str

    async def start(self, devices: Sequence[Device]) -> None: ...

    async def aclose(self) -> None: ...

    def states(self) -> list[MpsDaemonState]: ...
