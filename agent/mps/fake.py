"""In-memory MPS manager for the simulated node and tests: daemons that are always up, with
servers and clients that tests connect, and a record of every client terminated and every
server shut down."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from agent.core.errors import MpsControlError, MpsError
from agent.core.mpsstate import MpsDaemonState, MpsServerState
from agent.core.types import Device, SharingMode

FIRST_SERVER_PID = 4_000_000  # above any real PID, so a fake server never names a process


class FakeMpsManager:
    backend = "simulated"

    def __init__(self, *, default_thread_pct: float = 100.0) -> None:
        self._default_thread_pct = default_thread_pct
        self._states: dict[str, MpsDaemonState] = {}
        self._next_server = FIRST_SERVER_PID
        self.terminated: list[tuple[str, int, int]] = []  # (device, server, client)
        self.shut_down: list[tuple[str, int]] = []  # (device, server)
        self.kept = False  # the last aclose left the daemons running

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

    async def aclose(self, *, keep: bool = False) -> None:
        self.kept = keep
        if keep:
            return
        self._states = {
            uuid: MpsDaemonState(uuid, up=False, backend=self.backend, detail="stopped")
            for uuid in self._states
        }

    def states(self) -> list[MpsDaemonState]:
        return list(self._states.values())

    async def refresh(self) -> None:
        return None  # always current

    async def terminate_client(self, device_uuid: str, server_pid: int, client_pid: int) -> None:
        server = self._server(device_uuid, server_pid)
        if client_pid not in server.client_pids:
            raise MpsControlError(f"terminate_client failed: Server {server_pid} not found!")
        self.terminated.append((device_uuid, server_pid, client_pid))
        kept = tuple(p for p in server.client_pids if p != client_pid)
        self._replace(device_uuid, server, dataclasses.replace(server, client_pids=kept))

    async def shutdown_server(self, device_uuid: str, server_pid: int) -> None:
        server = self._server(device_uuid, server_pid)
        self.shut_down.append((device_uuid, server_pid))
        self._replace(device_uuid, server, None)

    def shm_dir(self, device_uuid: str) -> str:
        return ""  # no MPS server: containers get the caller's directory, if any

    async def claim_shm(self, device_uuid: str, trust_domain: str, *, sole: bool = False) -> str:
        return ""

    # -- test hooks ------------------------------------------------------------------------

    def mark_down(self, device_uuid: str, detail: str) -> None:
        """The daemon of ``device_uuid`` is down."""
        self._states[device_uuid] = MpsDaemonState(
            device_uuid, up=False, backend=self.backend, detail=detail
        )

    def connect(self, device_uuid: str, client_pid: int) -> int:
        """A client connects to the device's server (started on first use); its PID."""
        state = self._daemon(device_uuid)
        if state.servers:
            server = state.servers[0]
            grown = dataclasses.replace(server, client_pids=(*server.client_pids, client_pid))
            self._replace(device_uuid, server, grown)
            return server.pid
        self._next_server += 1
        server = MpsServerState(self._next_server, (client_pid,))
        self._states[device_uuid] = dataclasses.replace(state, servers=(server,))
        return server.pid

    # -- inside ----------------------------------------------------------------------------

    def _daemon(self, device_uuid: str) -> MpsDaemonState:
        state = self._states.get(device_uuid)
        if state is None or not state.up:
            raise MpsError(f"no running MPS daemon for device {device_uuid}")
        return state

    def _server(self, device_uuid: str, server_pid: int) -> MpsServerState:
        for server in self._daemon(device_uuid).servers:
            if server.pid == server_pid:
                return server
        raise MpsControlError(f"Server {server_pid} not found")

    def _replace(self, device_uuid: str, old: MpsServerState, new: MpsServerState | None) -> None:
        state = self._states[device_uuid]
        servers = tuple(s for s in (new if s is old else s for s in state.servers) if s is not None)
        self._states[device_uuid] = dataclasses.replace(state, servers=servers)
