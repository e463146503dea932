"""The garbage collector's settings for a long-running agent."""

from __future__ import annotations

import gc

GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    """Once started: what start-up made is frozen (full collections skip it), and young
    collections run every 50,000 allocations instead of 700, so the many short-lived
    objects of a busy event stream die before they are promoted. Full collections of
    about 100,000 objects took 100 to 150 ms while 50 watchers caught up over 100,000
    events (bench/admission.py); with these settings one short catch-up run saw a worst
    Admit of 49 ms, but full runs still see stalls of 1 to 2 s (docs/benchmarks.md)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
