"""Which monotonic constraints hold in a training set: the physics says more peer demand
never raises a target's retention (``features.monotonic``); grouped cross-validation says
whether the records agree. Scikit-learn is used here (training only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agent.estimator.crossval import FloatArray, forest_out_of_family
from agent.estimator.features import monotonic

CONSTRAINT_TOLERANCE = 0.02  # relative MAE a constraint group may cost before it is dropped
CONSTRAINT_FOLDS = 5
CONSTRAINT_TREES = 30


def constraint_group(name: str) -> str | None:
    """The resource a monotonic constraint is about (None: the feature has none)."""
    if monotonic(name) == 0:
        return None
    if name == "x.headroom":
        return "headroom"
    if name == "p.count":
        return "count"
    if "thread" in name:
        return "threads"
    if name.startswith("x.mem_") or name == "p.memory_frac_sum" or "fb_used" in name:
        return "memory"
    if any(key in name for key in ("dram", "l2", "memsys", "mem_util")):
        return "memory_system"
    return "compute"


def choose_constraints(
    x: FloatArray, y: FloatArray, groups: Sequence[str], names: Sequence[str], trees: int, seed: int
) -> tuple[list[int], dict[str, Any]]:
    """The monotonic constraints that hold in these records, by backward elimination: each
    round fits without each remaining group in turn and drops the one whose removal lowers
    the grouped-CV error most, if by more than ``CONSTRAINT_TOLERANCE``; it stops when none
    does (groups cost nothing alone and everything together, so one at a time)."""
    full = [monotonic(n) for n in names]
    by_group: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        group = constraint_group(name)
        if group is not None:
            by_group.setdefault(group, []).append(i)
    small = min(trees, CONSTRAINT_TREES)

    def without(dropped: set[str]) -> list[int]:
        off = {i for g in dropped for i in by_group[g]}
        return [0 if i in off else c for i, c in enumerate(full)]

    def mae(dropped: set[str]) -> float:
        oof = forest_out_of_family(x, y, groups, CONSTRAINT_FOLDS, small, seed, without(dropped))
        return float(np.mean(np.abs(y - oof.mean)))

    dropped: set[str] = set()
    current = mae(dropped)
    checks: dict[str, Any] = {"mae_all": current}
    while len(dropped) < len(by_group):
        trials = {g: mae(dropped | {g}) for g in sorted(set(by_group) - dropped)}
        for group, error in trials.items():
            checks[group] = {
                "kept": True,
                "features": len(by_group[group]),
                "mae_without": error,  # with the groups dropped before this round
                "round": len(dropped) + 1,
            }
        best = min(trials, key=lambda g: trials[g])
        if trials[best] >= current * (1 - CONSTRAINT_TOLERANCE):
            break
        dropped.add(best)
        current = trials[best]
        checks[best]["kept"] = False
    checks["mae_kept"] = current
    return without(dropped), checks
