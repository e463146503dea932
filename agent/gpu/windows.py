"""Fixed windows: samples of one device averaged over aligned intervals. Pure.

A window covers ``[k * window_s, (k + 1) * window_s)``; it closes when the first sample of a
later window arrives, or when its owner finds its time over (``close_if_due``). Each
field's mean and max are over the samples that had that field.
Only the last ``keep`` closed windows are kept, so memory is bounded.
"""

from __future__ import annotations

import math
from collections import deque

from agent.core.samples import Sample, WindowSample


class _Open:
    def __init__(self, index: int) -> None:
        self.index = index
        self.count = 0
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.maxima: dict[str, float] = {}

    def add(self, sample: Sample) -> None:
        self.count += 1
        for name, value in sample.counters.items():
            if not math.isfinite(value):
                continue
            self.sums[name] = self.sums.get(name, 0.0) + value
            self.counts[name] = self.counts.get(name, 0) + 1
            self.maxima[name] = max(self.maxima.get(name, value), value)


class WindowAggregator:
    def __init__(self, device_uuid: str, *, window_s: float, keep: int = 60) -> None:
        self.device_uuid = device_uuid
        self.window_s = window_s
        self._open: _Open | None = None
        self._closed: deque[WindowSample] = deque(maxlen=keep)

    def add(self, sample: Sample) -> WindowSample | None:
        """Add a sample; returns the window it closed, if any."""
        index = math.floor(sample.taken_at / self.window_s)
        closed = None
        if self._open is not None and index > self._open.index:
            closed = self._close(self._open)
        if self._open is None or index > self._open.index:
            self._open = _Open(index)
        if index == self._open.index:
            self._open.add(sample)
        return closed

    def _close(self, window: _Open) -> WindowSample:
        result = WindowSample(
            device_uuid=self.device_uuid,
            start_at=window.index * self.window_s,
            window_s=self.window_s,
            sample_count=window.count,
            mean={k: window.sums[k] / window.counts[k] for k in window.sums},
            max=dict(window.maxima),
        )
        self._closed.append(result)
        self._open = None
        return result

    def close_if_due(self, now: float) -> WindowSample | None:
        """Close the open window once its time is over (``now`` at or past its end), so a
        window's verdict does not wait for the next sample; returns it, if closed."""
        if self._open is None or now < (self._open.index + 1) * self.window_s:
            return None
        return self._close(self._open)

    def latest(self) -> WindowSample | None:
        return self._closed[-1] if self._closed else None

    def history(self) -> list[WindowSample]:
        return list(self._closed)
