"""CPU time of this process and its children, by part, between two moments: where a
benchmark's cores went (``psutil``; a child that exited meanwhile is not counted)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import psutil

Classify = Callable[[list[str]], str]  # a child's command line -> its part's name


def cpu_by_part(classify: Classify, *, this: str = "harness") -> Counter[str]:
    """Seconds of CPU (user + system) used so far, by part: this process as ``this``, each
    live child (recursively) as ``classify`` names it by its command line."""
    me = psutil.Process()
    used: Counter[str] = Counter()
    times = me.cpu_times()
    used[this] += times.user + times.system
    for child in me.children(recursive=True):
        try:
            times, command = child.cpu_times(), child.cmdline()
        except psutil.Error:  # gone meanwhile
            continue
        used[classify(command)] += times.user + times.system
    return used


def ms_per(before: Counter[str], after: Counter[str], count: int) -> dict[str, float]:
    """Milliseconds of CPU per item of ``count``, by part and in ``all``."""
    spent = {part: after[part] - before.get(part, 0.0) for part in after}
    spent["all"] = sum(spent.values())
    return {part: round(1e3 * s / max(count, 1), 1) for part, s in sorted(spent.items())}
