"""The transferring estimator as the agent runs it: a monotone base of aggregate pressure
(``pressure.Monotone``), a Random Forest's correction of its residual, shrunk, and the
shrinkage toward the base for a workload unlike every training family. Pure numpy.

    mean   = base + shrink * w * correction
    spread = shrink * w * trees' spread ("trees")  or 0 ("point")  + (1 - w) * base_doubt

``w`` is 1 for a workload as near the training families as a held-out family was to the
others in training (``REACH`` times the median of that distance), and falls as the square
of the ratio beyond; the distance is taken over the target's own counters, each weighted
by how much the correction reads it (the forest's importances). Where the correction is
shrunk away, the base's own doubt (its out-of-family residual spread) takes its place, so
``p_keep`` asks more of an estimate it has less reason to trust. A rule (``mode``
``rule:<term>``) is the same with one term and no correction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.estimator.compiled import CompiledForest
from agent.estimator.pressure import Monotone

FloatArray = npt.NDArray[np.float64]
REACH = 1.5
CORRECTION_FILE = "correction.npz"


@dataclass(frozen=True)
class Far:
    """How far a workload is from the training families, over the target's own counters."""

    columns: list[int]
    center: FloatArray
    scale: FloatArray  # per column: its standard deviation over the importance's root
    rows: FloatArray  # the training workloads, scaled (unique)
    typical: float  # the median distance of a held-out family to the others

    def distance(self, x: FloatArray) -> FloatArray:
        z = (x[:, self.columns] - self.center) / self.scale
        gaps = ((z[:, None, :] - self.rows[None, :, :]) ** 2).sum(axis=2)
        result: FloatArray = np.sqrt(gaps.min(axis=1))
        return result

    def weight(self, x: FloatArray) -> FloatArray:
        d = self.distance(x)
        reach = REACH * max(self.typical, 1e-9)
        result: FloatArray = np.clip((reach / np.maximum(d, 1e-12)) ** 2, 0.0, 1.0)
        return result

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "center": [float(v) for v in self.center],
            "scale": [float(v) for v in self.scale],
            "rows": [[float(v) for v in row] for row in self.rows],
            "typical": self.typical,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Far:
        return cls(
            [int(c) for c in body["columns"]],
            np.asarray(body["center"], dtype=np.float64),
            np.asarray(body["scale"], dtype=np.float64),
            np.asarray(body["rows"], dtype=np.float64).reshape(-1, len(body["columns"])),
            float(body["typical"]),
        )


@dataclass(frozen=True)
class Structure:
    mode: str  # "base", "corrected", "corrected_p_keep" or "rule:<term>"
    names: list[str]
    base: Monotone
    correction: CompiledForest | None = None
    shrink: float = 0.0
    far: Far | None = None
    base_doubt: float = 0.0

    @property
    def spread_from_trees(self) -> bool:
        return self.mode == "corrected_p_keep"

    def parts(self, x: npt.ArrayLike) -> dict[str, FloatArray]:
        """The base, the correction, its weight and the trees' spread, per row."""
        rows = np.atleast_2d(np.asarray(x, dtype=np.float64))
        base = self.base.predict(rows, self.names)
        zeros = np.zeros(rows.shape[0])
        if self.correction is None or self.shrink == 0.0:
            return {"base": base, "correction": zeros, "weight": zeros, "trees": zeros}
        trees = self.correction.tree_predictions(rows)
        weight = self.far.weight(rows) if self.far is not None else np.ones(rows.shape[0])
        return {
            "base": base,
            "correction": trees.mean(axis=1),
            "weight": weight,
            "trees": trees.std(axis=1),
        }

    def predict_with_spread(self, x: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        p = self.parts(x)
        return combine(p, self.shrink, self.spread_from_trees, self.base_doubt, self.active)

    @property
    def active(self) -> bool:
        return self.correction is not None and self.shrink > 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "base": self.base.to_json(),
            "shrink": self.shrink,
            "far": self.far.to_json() if self.far is not None else None,
            "base_doubt": self.base_doubt,
            "correction": CORRECTION_FILE if self.correction is not None else None,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any], names: Sequence[str], folder: Path) -> Structure:
        correction = None
        if body.get("correction"):
            correction = CompiledForest.load(folder / str(body["correction"]))
        far = Far.from_json(body["far"]) if body.get("far") else None
        return cls(
            str(body["mode"]),
            list(names),
            Monotone.from_json(body["base"]),
            correction,
            float(body.get("shrink", 0.0)),
            far,
            float(body.get("base_doubt", 0.0)),
        )


def combine(
    parts: Mapping[str, FloatArray], shrink: float, from_trees: bool, doubt: float, active: bool
) -> tuple[FloatArray, FloatArray]:
    """Mean and spread from the parts (see the module): the one formula training scores
    candidates with and the agent predicts with."""
    if not active:
        return parts["base"], np.zeros_like(parts["base"])
    kept = shrink * parts["weight"]
    mean = parts["base"] + kept * parts["correction"]
    own = kept * parts["trees"] if from_trees else np.zeros_like(mean)
    spread: FloatArray = own + (1.0 - parts["weight"]) * doubt
    return mean, spread
