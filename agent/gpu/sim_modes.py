"""The simulated driver's compute modes, for ``gpushare gpu reset-compute-mode --sim``.

A real driver keeps a GPU's compute mode after the process that set it ends; so does the
simulated one, in a JSON file (:data:`MODES_FILE` in the simulated node's runtime
directory)::

    {"GPU-8a5b...": {"mode": "EXCLUSIVE_PROCESS"},
     "GPU-13c0...": {"mode": "EXCLUSIVE_PROCESS", "refuse": 4}}

A GPU not in the file is in DEFAULT. ``refuse``: the NVML return code (4 is
NVML_ERROR_NO_PERMISSION) with which the simulated driver refuses to change that GPU's mode;
the error reads as NVML's own would (:func:`~agent.gpu.nvml.translate`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from agent.core.errors import SimulationError
from agent.core.types import Device
from agent.gpu.compute_mode import ComputeMode
from agent.gpu.fake import FakeGpuBackend
from agent.gpu.nvml import translate

MODES_FILE = "sim-compute-modes.json"


class FileComputeModes:
    """The file's table: read and written whole, each write replacing it at once."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def table(self) -> dict[str, dict[str, Any]]:
        try:
            loaded = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise SimulationError(f"{self.path}: not a table of compute modes: {exc}") from exc
        if not isinstance(loaded, dict) or not all(isinstance(v, dict) for v in loaded.values()):
            raise SimulationError(f"{self.path}: expected {{UUID: {{mode: ..., refuse: ...}}}}")
        return loaded

    async def read(self, device: Device) -> ComputeMode:
        entry = self.table().get(device.uuid, {})
        try:
            return ComputeMode(entry.get("mode", ComputeMode.DEFAULT))
        except ValueError:
            raise SimulationError(
                f"{self.path}: {device.uuid}: mode {entry.get('mode')!r} is none of "
                f"{', '.join(ComputeMode)}"
            ) from None

    def write(self, device: Device, mode: ComputeMode) -> None:
        table = self.table()
        entry = table.setdefault(device.uuid, {})
        if refuse := entry.get("refuse"):
            error = pynvml.NVMLError(int(refuse))
            raise translate(error, f"set the compute mode of {device.uuid}") from error
        entry["mode"] = str(mode)
        partial = self.path.with_name(self.path.name + ".new")
        partial.write_text(json.dumps(table, indent=1) + "\n")
        os.replace(partial, self.path)


class SimModesGpuBackend(FakeGpuBackend):
    """The fake inventory whose compute modes are the file's (the agent's port, unchanged:
    a MIG instance's mode is its GPU's and is not set)."""

    def __init__(self, devices: Sequence[Device], modes: FileComputeModes) -> None:
        super().__init__(devices)
        self.modes = modes

    async def set_compute_mode(self, device: Device, *, exclusive: bool) -> None:
        if device.is_mig:
            return
        mode = ComputeMode.EXCLUSIVE_PROCESS if exclusive else ComputeMode.DEFAULT
        self.modes.write(device, mode)
        await super().set_compute_mode(device, exclusive=exclusive)
