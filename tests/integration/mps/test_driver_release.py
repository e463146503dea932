"""At start, MPS binaries of another driver release are refused before any daemon starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.core.errors import MpsError
from agent.gpu.fake import FakeGpuBackend
from agent.node.events import EventLog
from agent.runtime.wiring import build_mps_manager
from tests.helpers import sim_settings


def control_binary(tmp_path: Path, release: str) -> str:
    """An executable that names its driver release the way the real one does."""
    path = tmp_path / "nvidia-cuda-mps-control"
    path.write_bytes(b"#!/bin/sh\nexit 1\n# \x00" + release.encode() + b"\x00\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(("driver", "starts"), [("550.54.15", False), ("535.309.01", True)])
async def test_a_binary_of_another_release_is_refused(
    tmp_path: Path, driver: str, starts: bool
) -> None:
    binary = control_binary(tmp_path, "535.309.01")
    settings = sim_settings(tmp_path, **{"mps.control_binary": binary})
    gpu = FakeGpuBackend.with_gpus(1)
    gpu.driver = driver
    manager = build_mps_manager(settings, gpu, EventLog())
    os.makedirs(settings.mps_root_dir, exist_ok=True)
    if starts:
        await manager.start(await gpu.list_devices())  # its daemon fails to start: reported down
        assert not manager.states()[0].up
        await manager.aclose()
    else:
        with pytest.raises(MpsError, match=r"release 535\.309\.01 but the running driver is 550"):
            await manager.start(await gpu.list_devices())
        assert not list(Path(settings.mps_root_dir).iterdir()), "no daemon directory made"
