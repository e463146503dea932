"""Counters from DCGM through its Python bindings (``pydcgm``/``DcgmReader``).

The bindings ship with DCGM, not on PyPI: they are looked for on ``sys.path`` and then in
DCGM's install folders (4.x: ``/usr/share/datacenter-gpu-manager-4/bindings/python3``, 3.x:
``/usr/local/dcgm/bindings/python3``). The reader watches the profiling and device fields at
the sampling period and is read in a worker thread (the bindings block). Values are keyed
by numeric field id, which did not change when DCGM 4.6 renamed the fields. GPU ids are
DCGM's, which follow NVML's indices; MIG instances are not read from DCGM (choose the
exporter or NVML on MIG nodes).
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from agent.core.errors import TelemetryError
from agent.core.samples import Sample
from agent.core.types import Device
from agent.gpu.fields import DCGM_FIELDS, from_dcgm_ids

BINDINGS_DIRS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
)


def load_reader_class(dirs: Sequence[str] = BINDINGS_DIRS) -> Any:
    """``DcgmReader.DcgmReader``, or TelemetryError saying where it was looked for."""
    for directory in ("", *dirs):
        if directory and directory not in sys.path:
            sys.path.append(directory)
        try:
            return importlib.import_module("DcgmReader").DcgmReader
        except ImportError:
            continue
    raise TelemetryError(
        "DCGM's Python bindings (DcgmReader) are not installed; looked on sys.path and in "
        + ", ".join(dirs)
    )


class DcgmTelemetry:
    name = "dcgm"

    def __init__(
        self,
        *,
        hostname: str = "localhost",
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._hostname = hostname
        self._interval_s = interval_s
        self._clock = clock
        self._reader: Any = None

    async def start(self) -> None:
        self._reader = await asyncio.to_thread(self._connect)

    def _connect(self) -> Any:
        reader_class = load_reader_class()
        try:
            reader = reader_class(
                hostname=self._hostname,
                fieldIds=[field_id for field_id, *_rest in DCGM_FIELDS],
                updateFrequency=int(self._interval_s * 1_000_000),
                ignoreBlank=True,
            )
            first = reader.GetLatestGpuValuesAsFieldIdDict()
        except Exception as exc:
            raise TelemetryError(f"cannot read DCGM on {self._hostname}: {exc!r}") from exc
        if not first:
            raise TelemetryError(f"DCGM on {self._hostname} returned no GPU values")
        return reader

    async def aclose(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await asyncio.to_thread(getattr(reader, "Shutdown", lambda: None))

    async def read(self, devices: Sequence[Device]) -> list[Sample]:
        if self._reader is None:
            raise TelemetryError("the DCGM source is not started")
        try:
            values = await asyncio.to_thread(self._reader.GetLatestGpuValuesAsFieldIdDict)
        except Exception as exc:
            raise TelemetryError(f"DCGM read failed: {exc!r}") from exc
        return samples_from_dcgm(values, devices, taken_at=self._clock())


def samples_from_dcgm(
    values: dict[int, dict[int, float]], devices: Sequence[Device], *, taken_at: float
) -> list[Sample]:
    """``{gpu_id: {field_id: value}}`` -> one sample per whole-GPU device (by index)."""
    by_index = {d.index: d for d in devices if d.parent_uuid is None}
    return [
        Sample(by_index[gpu_id].uuid, taken_at, from_dcgm_ids(fields))
        for gpu_id, fields in values.items()
        if gpu_id in by_index
    ]
