"""Port of the MPS domain: the node's MPS control daemons as one service."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from agent.core.mpsstate import MpsDaemonState
from agent.core.types import Device


class MpsManager(Protocol):
    """Starts, watches and stops one MPS control daemon per shared device."""

    backend: str

    async def start(self, devices: Sequence[Device]) -> None: ...

    async def aclose(self, *, keep: bool = False) -> None:
        """Stop the daemons; with ``keep`` leave them (and their jobs) running."""
        ...

    async def run(self) -> None:
        """Keep the daemons healthy until cancelled (a supervised task)."""
        ...

    def states(self) -> list[MpsDaemonState]: ...

    async def refresh(self) -> None:
        """Re-read every daemon's servers and clients now, so ``states`` is current."""
        ...

    async def terminate_client(self, device_uuid: str, server_pid: int, client_pid: int) -> None:
        """Have the device's daemon end one client's context (``terminate_client``)."""
        ...

    async def shutdown_server(self, device_uuid: str, server_pid: int) -> None:
        """Shut one MPS server of the device down, so a faulted server can start afresh."""
        ...

    def shm_dir(self, device_uuid: str) -> str:
        """The host directory the device's client containers get at /dev/shm: its MPS
        servers' own; "" when they have none (the caller's shared directory then)."""
        ...

    async def claim_shm(self, device_uuid: str, trust_domain: str, *, sole: bool = False) -> str:
        """Make the device's shared memory ready for a container of ``trust_domain`` (emptied
        and the servers restarted when it served another domain); what ``shm_dir`` names
        now. Raises :class:`~agent.core.errors.MpsError` when nothing may be handed out."""
        ...


class ControlChannel(Protocol):
    """Sends one command line to one control daemon and returns its answer (stdout).

    Raises :class:`~agent.core.errors.MpsDaemonDownError` when no daemon answers and
    :class:`~agent.core.errors.MpsControlError` on a timeout or transport error. Command
    errors inside an answer are the caller's to read (see ``mps.commands.check``).
    """

    async def execute(self, command: str) -> str: ...


class EventSink(Protocol):
    """Where the MPS domain reports what it did or saw (the runtime's event log)."""

    def __call__(
        self,
        kind: str,
        message: str,
        *,
        device_uuid: str | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> None: ...
