"""What the fake control daemon says each client holds comes before what the client
declares in its environment, in the simulated node's process lists."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from agent.core.mpsstate import MpsDaemonState, MpsServerState
from agent.core.types import GpuProcess
from agent.core.units import GIB, MIB
from agent.mps.fake_users import CLIENT_MEMORY_FILE
from agent.sim.node import SimNodeSpec
from agent.sim.processes import USED_MEMORY_VAR, SimGpuBackend, recorded_used_memory_bytes


def daemon(uuid: str, pipe_dir: Path, *clients: int) -> MpsDaemonState:
    return MpsDaemonState(
        uuid, up=True, backend="fake", pipe_dir=str(pipe_dir), servers=(MpsServerState(9, clients),)
    )


def test_the_record_is_read_per_device_and_garbage_skipped(tmp_path: Path) -> None:
    (tmp_path / CLIENT_MEMORY_FILE).write_text("11 1024\nnot a line\n12 x\n13 512\n")
    states = [daemon("GPU-a", tmp_path, 11, 13), daemon("GPU-b", tmp_path / "none", 14)]
    assert recorded_used_memory_bytes(states, "GPU-a") == {11: GIB, 13: 512 * MIB}
    assert recorded_used_memory_bytes(states, "GPU-b") == {}, "no record: nothing said"


async def test_the_record_comes_before_the_declaration(tmp_path: Path) -> None:
    (device,) = SimNodeSpec.default().devices[:1]
    env = {**os.environ, USED_MEMORY_VAR: "3GiB"}
    with (
        subprocess.Popen(["sleep", "30"], env=env) as recorded,
        subprocess.Popen(["sleep", "30"], env=env) as declared,
    ):
        try:
            (tmp_path / CLIENT_MEMORY_FILE).write_text(f"{recorded.pid} 1024\n")
            gpu = SimGpuBackend([device])
            gpu.mps_states = lambda: [daemon(device.uuid, tmp_path, recorded.pid, declared.pid)]
            listed = await gpu.processes(device)
        finally:
            recorded.kill()
            declared.kill()
    assert listed == [
        GpuProcess(recorded.pid, GIB, mps=True),
        GpuProcess(declared.pid, 3 * GIB, mps=True),
    ]
