"""A device's counters as the agent reads them: one sample, and a window of samples.

Counters go by their canonical names (``sm_active``, ``dram_active``, ...); the mappings
are read-only once made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


def _frozen_counters(values: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of a device's counters, canonical names, at ``taken_at``."""

    device_uuid: str
    taken_at: float
    counters: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counters", _frozen_counters(self.counters))


@dataclass(frozen=True, slots=True)
class WindowSample:
    """Counters of one device aggregated over a fixed window: per-field mean and max."""

    device_uuid: str
    start_at: float
    window_s: float
    sample_count: int
    mean: Mapping[str, float] = field(default_factory=dict)
    max: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", _frozen_counters(self.mean))
        object.__setattr__(self, "max", _frozen_counters(self.max))
