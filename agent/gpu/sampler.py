"""The sampler: reads every device's counters at a fixed period and keeps the newest.

A failing source is counted and logged, never fatal: its devices go stale (no sample newer
than ``stale_after_s``) and recover by themselves when the source answers again. Only a
bug (an exception outside the agent's error tree) ends the task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from agent.core.errors import GpushareError
from agent.core.types import Device, Sample
from agent.gpu.port import TelemetrySource

log = logging.getLogger(__name__)


class Sampler:
    def __init__(
        self,
        source: TelemetrySource,
        devices: Sequence[Device],
        *,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._devices = list(devices)
        self._interval_s = interval_s
        self._clock = clock
        self._latest: dict[str, Sample] = {}
        self.errors_total = 0
        self.samples_total = 0
        self.last_error = ""

    @property
    def source_name(self) -> str:
        return self._source.name

    async def run(self) -> None:
        """Sample forever at the configured period (a supervised task)."""
        while True:
            await self.sample_once()
            await asyncio.sleep(self._interval_s)

    async def sample_once(self) -> None:
        try:
            samples = await self._source.read(self._devices)
        except GpushareError as exc:
            self.errors_total += 1
            if str(exc) != self.last_error:
                log.warning("telemetry source %s failed: %s", self._source.name, exc)
            self.last_error = str(exc)
            return
        if self.last_error:
            log.info("telemetry source %s recovered", self._source.name)
            self.last_error = ""
        for sample in samples:
            self._latest[sample.device_uuid] = sample
        self.samples_total += len(samples)

    def latest(self) -> list[Sample]:
        return [self._latest[d.uuid] for d in self._devices if d.uuid in self._latest]

    def stale_devices(self, *, stale_after_s: float) -> list[str]:
        """UUIDs of devices with no sample newer than ``stale_after_s``."""
        now = self._clock()
        return [
            d.uuid
            for d in self._devices
            if d.uuid not in self._latest or now - self._latest[d.uuid].taken_at > stale_after_s
        ]
