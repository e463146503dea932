"""The simulated node's NVML process lists: the MPS clients of each device, each with the
device memory its environment declares (``None``, NVML's "not available", otherwise), and
the wiring that hands the simulated GPU the MPS daemons' client lists."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agent.core.mpsstate import MpsDaemonState, MpsServerState
from agent.core.types import GpuProcess
from agent.core.units import GIB
from agent.node.events import EventLog
from agent.runtime.wiring import build_ports
from agent.sim.node import SimNodeSpec
from agent.sim.processes import (
    USED_MEMORY_VAR,
    SimGpuBackend,
    declared_used_memory_bytes,
    mps_clients,
)
from tests.helpers import sim_settings


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (b"A=1\0GPUSHARE_SIM_USED_MEMORY=3GiB\0B=2\0", 3 * GIB),
        (b"GPUSHARE_SIM_USED_MEMORY=1024\0", 1024),
        (b"A=1\0", None),  # declares nothing
        (b"GPUSHARE_SIM_USED_MEMORY=lots\0", None),  # unreadable
        (b"GPUSHARE_SIM_USED_MEMORY=\0", None),
        (None, None),  # no such process
    ],
)
def test_declared_used_memory(tmp_path: Path, environ: bytes | None, expected: int | None) -> None:
    if environ is not None:
        (tmp_path / "42").mkdir()
        (tmp_path / "42" / "environ").write_bytes(environ)
    assert declared_used_memory_bytes(42, proc=str(tmp_path)) == expected


def daemon(uuid: str, *clients: tuple[int, ...]) -> MpsDaemonState:
    servers = tuple(MpsServerState(100 + i, c) for i, c in enumerate(clients))
    return MpsDaemonState(uuid, up=True, backend="fake", servers=servers)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], []),
        ([daemon("GPU-a", (1, 2), (3,)), daemon("GPU-b", (4,))], [1, 2, 3]),
        ([daemon("GPU-a", (2, 1), (1,))], [2, 1]),  # once each
        ([daemon("GPU-b", (4,))], []),
    ],
)
def test_mps_clients(states: list[MpsDaemonState], expected: list[int]) -> None:
    assert mps_clients(states, "GPU-a") == expected


async def test_the_clients_are_listed_with_their_declared_memory() -> None:
    (device,) = SimNodeSpec.default().devices[:1]
    gpu = SimGpuBackend([device])
    env = {**os.environ, USED_MEMORY_VAR: "2GiB"}
    with subprocess.Popen(["sleep", "30"], env=env) as client:
        try:
            gpu.mps_states = lambda: [daemon(device.uuid, (client.pid, 2**22 + 7))]
            gpu.process_table[device.uuid] = [GpuProcess(9, GIB)]  # a test's own, kept
            listed = await gpu.processes(device)
        finally:
            client.kill()
    assert listed == [
        GpuProcess(9, GIB),
        GpuProcess(client.pid, 2 * GIB, mps=True),
        GpuProcess(2**22 + 7, None, mps=True),  # gone: NVML cannot say
    ]


def test_the_simulated_node_reads_the_daemons_clients(tmp_path: Path) -> None:
    ports = build_ports(sim_settings(tmp_path), EventLog())
    assert isinstance(ports.gpu, SimGpuBackend)
    assert ports.gpu.mps_states == ports.mps.states
