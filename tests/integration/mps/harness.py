"""Build a DaemonSupervisor around a real or fake control binary, with short timings; the
two binaries as test parameters."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.core.types import Device
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend
from agent.mps.control import SubprocessMpsControl
from agent.mps.options import DaemonDefaults, SupervisorOptions
from agent.mps.port import ControlChannel
from agent.mps.supervisor import DaemonSupervisor

REAL_BINARY = shutil.which("nvidia-cuda-mps-control")
_BESIDE_PYTHON = Path(sys.executable).parent / "gpushare-fake-mps-control"
FAKE_BINARY = (
    str(_BESIDE_PYTHON)
    if _BESIDE_PYTHON.exists()
    else shutil.which("gpushare-fake-mps-control") or str(_BESIDE_PYTHON)
)

REAL = pytest.param(
    REAL_BINARY or "",
    id="real",
    marks=[
        pytest.mark.mps_binary,
        pytest.mark.skipif(REAL_BINARY is None, reason="nvidia-cuda-mps-control not installed"),
    ],
)
BINARIES = [pytest.param(FAKE_BINARY, id="fake"), REAL]

FAKE_UUID = "GPU-11111111-2222-3333-4444-555555555555"


def real_device() -> Device | None:
    """The first real GPU where NVML answers: a real control daemon given a device that
    does not exist exits at start on a machine with a driver (status 100)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        memory_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        return Device(uuid, 0, pynvml.nvmlDeviceGetName(handle), memory_bytes)
    finally:
        pynvml.nvmlShutdown()


@dataclass
class Recorder:
    """An EventSink that keeps what it is told."""

    events: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def __call__(
        self,
        kind: str,
        message: str,
        *,
        device_uuid: str | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> None:
        self.events.append((kind, message, dict(attrs or {})))

    def kinds(self) -> list[str]:
        return [kind for kind, _m, _a in self.events]


def supervisor_options(binary: str, root: Path, **options: object) -> SupervisorOptions:
    """The supervisors' options, short timings, with ``options`` over them."""
    values: dict[str, object] = {
        "binary": binary,
        "root_dir": str(root / "mps"),
        "probe_interval_s": 0.2,
        "hung_after_probes": 1,
        "start_timeout_s": 5.0,
        "backoff_initial_s": 0.1,
        "backoff_max_s": 1.0,
        "quit_timeout_s": 1,
    }
    values.update(options)
    return SupervisorOptions(**values)  # type: ignore[arg-type]


def make_supervisor(
    binary: str,
    root: Path,
    *,
    device: Device | None = None,
    defaults: DaemonDefaults | None = None,
    **options: object,
) -> tuple[DaemonSupervisor, Recorder, FakeGpuBackend]:
    gpu = FakeGpuBackend.with_gpus(1)
    device = device or real_device() or Device(FAKE_UUID, 0, "H100", 80 * GIB)
    recorder = Recorder()

    def channel(_device: Device, env: Mapping[str, str]) -> ControlChannel:
        return SubprocessMpsControl(binary, env, timeout_s=1.0)

    async def set_exclusive(d: Device, exclusive: bool) -> None:
        await gpu.set_compute_mode(d, exclusive=exclusive)

    supervisor = DaemonSupervisor(
        device,
        supervisor_options(binary, root, **options),
        defaults or DaemonDefaults(thread_pct=40.0, memory_limit_bytes=20 * GIB),
        channel_factory=channel,
        emit=recorder,
        set_exclusive=set_exclusive,
    )
    return supervisor, recorder, gpu


def front_end(binary: str, supervisor: DaemonSupervisor, command: str) -> str:
    """Ask the daemon directly, as an on-call engineer (or an intruder) would."""
    done = subprocess.run(
        [binary],
        input=command + "\n",
        capture_output=True,
        text=True,
        env={**os.environ, **supervisor.env},
        timeout=10,
        check=False,
    )
    return done.stdout + done.stderr


async def wait_for(predicate: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not true within {timeout_s} s"
        await asyncio.sleep(0.05)
