"""The sampler: reads every device's counters at a fixed period into fixed windows.

A failing source is counted and logged (once per distinct error), never fatal: its devices
get no samples, go stale after ``stale_after_s``, and recover by themselves when the source
answers again. A device the source does not report (an unknown GPU label) goes stale the
same way. Only a bug (an exception outside the agent's error tree) ends the task. Closed
windows are handed to the ``on_window`` listeners (the degradation rule, the CLI).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from agent.core.errors import GpushareError
from agent.core.samples import Sample, WindowSample
from agent.core.types import Device
from agent.gpu.port import TelemetrySource
from agent.gpu.windows import WindowAggregator

log = logging.getLogger(__name__)

WindowListener = Callable[[WindowSample], None]


class Sampler:
    def __init__(
        self,
        source: TelemetrySource,
        devices: Sequence[Device],
        *,
        interval_s: float,
        window_s: float = 10.0,
        keep_windows: int = 60,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._devices = list(devices)
        self._interval_s = interval_s
        self._clock = clock
        self._latest: dict[str, Sample] = {}
        self._windows = {
            d.uuid: WindowAggregator(d.uuid, window_s=window_s, keep=keep_windows)
            for d in self._devices
        }
        self.listeners: list[WindowListener] = []
        self.errors_total = 0
        self.samples_total = 0
        self.last_error = ""
        self.up = False

    @property
    def source_name(self) -> str:
        return self._source.name

    async def run(self) -> None:
        """Sample forever at the configured period (a supervised task)."""
        while True:
            await self.sample_once()
            await asyncio.sleep(self._interval_s)
            self.close_due_windows()

    def close_due_windows(self) -> None:
        """Close every window whose time is over and hand it to the listeners."""
        now = self._clock()
        for aggregator in self._windows.values():
            closed = aggregator.close_if_due(now)
            if closed is not None:
                for listener in self.listeners:
                    listener(closed)

    async def sample_once(self) -> None:
        try:
            samples = await self._source.read(self._devices)
        except GpushareError as exc:
            self._failed(str(exc))
            return
        if self.last_error:
            log.info("telemetry source %s recovered", self._source.name)
            self.last_error = ""
        self.up = True
        for sample in samples:
            self._accept(sample)

    def _failed(self, error: str) -> None:
        self.errors_total += 1
        self.up = False
        if error != self.last_error:
            log.warning("telemetry source %s failed: %s", self._source.name, error)
        self.last_error = error

    def _accept(self, sample: Sample) -> None:
        aggregator = self._windows.get(sample.device_uuid)
        if aggregator is None:
            return
        self._latest[sample.device_uuid] = sample
        self.samples_total += 1
        closed = aggregator.add(sample)
        if closed is not None:
            for listener in self.listeners:
                listener(closed)

    def latest(self) -> list[Sample]:
        return [self._latest[d.uuid] for d in self._devices if d.uuid in self._latest]

    def latest_windows(self) -> list[WindowSample]:
        windows = (self._windows[d.uuid].latest() for d in self._devices)
        return [w for w in windows if w is not None]

    def stale_devices(self, *, stale_after_s: float) -> list[str]:
        """UUIDs of devices with no sample newer than ``stale_after_s``."""
        now = self._clock()
        return [
            d.uuid
            for d in self._devices
            if d.uuid not in self._latest or now - self._latest[d.uuid].taken_at > stale_after_s
        ]
