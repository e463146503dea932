"""The simulated node's NVML process lists: its MPS clients, with the memory each declares.

A real driver lists each MPS client in ``nvmlDeviceGetMPSComputeRunningProcesses`` with
its ``usedGpuMemory``, or ``NVML_VALUE_NOT_AVAILABLE`` (``None`` here) where it cannot say.
On the simulated node nothing allocates device memory, so a simulated client declares what
it would use in its environment, ``GPUSHARE_SIM_USED_MEMORY`` (``3GiB``, ``1024``); one
that declares nothing, or something unreadable, is listed with ``None``. The clients are
those connected to the device's MPS servers (``fake_connect_client`` on the fake control
daemon). What the fake daemon was told a client holds (``fake_client_memory PID MIB``, kept
in its pipe directory) comes first: it is the simulated GPU's own account, per client
process, as NVML's is. Processes a test puts in ``process_table`` are listed too, as on
the plain fake.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

from agent.core.errors import UnitError
from agent.core.identity import marker_from_chunks
from agent.core.mpsstate import MpsDaemonState
from agent.core.types import Device, GpuProcess
from agent.core.units import MIB, parse_bytes
from agent.gpu.fake import FakeGpuBackend
from agent.mps.fake_users import CLIENT_MEMORY_FILE, parse_client_memory

USED_MEMORY_VAR = "GPUSHARE_SIM_USED_MEMORY"
CHUNK_BYTES = 4096


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while chunk := f.read(CHUNK_BYTES):
        yield chunk


def declared_used_memory_bytes(pid: int, *, proc: str = "/proc") -> int | None:
    """What the process declares in ``GPUSHARE_SIM_USED_MEMORY`` (blocking: reads /proc)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb", buffering=0) as f:
            declared = marker_from_chunks(_chunks(f), USED_MEMORY_VAR)
    except OSError:
        return None
    try:
        return parse_bytes(declared) if declared else None
    except UnitError:
        return None


def mps_clients(states: Sequence[MpsDaemonState], device_uuid: str) -> list[int]:
    """The client PIDs of the device's MPS servers, in order, once each."""
    pids = [
        pid
        for daemon in states
        if daemon.device_uuid == device_uuid
        for server in daemon.servers
        for pid in server.client_pids
    ]
    return list(dict.fromkeys(pids))


def recorded_used_memory_bytes(
    states: Sequence[MpsDaemonState], device_uuid: str
) -> dict[int, int]:
    """What the device's fake control daemons say each client holds, in bytes (blocking:
    reads their pipe directories); empty where they say nothing."""
    table: dict[int, int] = {}
    for daemon in states:
        if daemon.device_uuid != device_uuid or not daemon.pipe_dir:
            continue
        try:
            with open(f"{daemon.pipe_dir}/{CLIENT_MEMORY_FILE}") as f:
                text = f.read()
        except OSError:
            continue
        table.update({pid: mib * MIB for pid, mib in parse_client_memory(text).items()})
    return table


class SimGpuBackend(FakeGpuBackend):
    """The fake inventory, with the device's MPS clients in its process lists."""

    def __init__(self, devices: Sequence[Device]) -> None:
        super().__init__(devices)
        self.mps_states: Callable[[], Sequence[MpsDaemonState]] = list

    async def processes(self, device: Device) -> list[GpuProcess]:
        listed = await super().processes(device)
        known = {p.pid for p in listed}
        states = self.mps_states()
        clients = [pid for pid in mps_clients(states, device.uuid) if pid not in known]
        return listed + await asyncio.to_thread(_client_processes, clients, states, device.uuid)


def _client_processes(
    pids: list[int], states: Sequence[MpsDaemonState], device_uuid: str
) -> list[GpuProcess]:
    recorded = recorded_used_memory_bytes(states, device_uuid) if pids else {}
    return [
        GpuProcess(
            pid, recorded[pid] if pid in recorded else declared_used_memory_bytes(pid), mps=True
        )
        for pid in pids
    ]
