"""The simpler regression the forest is compared against: ridge regression on standardised
features, stored as numbers and predicted with numpy. Pure.

Training (``training``) keeps it instead of the forest when grouped cross-validation gives
it the lower error: on a small or unlike dataset a line can travel to new workload families
better than a forest of deep trees. It has no spread of its own (0): its doubt is the
calibration's, from its out-of-family residuals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
RIDGE_ALPHA = 1.0
CLIP = (0.0, 1.5)


@dataclass(frozen=True)
class LinearModel:
    coef: FloatArray
    intercept: float
    center: FloatArray
    scale: FloatArray

    @classmethod
    def fit(cls, x: FloatArray, y: FloatArray, alpha: float = RIDGE_ALPHA) -> LinearModel:
        center = x.mean(axis=0)
        scale = x.std(axis=0)
        scale = np.where(scale > 0, scale, 1.0)
        z = (x - center) / scale
        target = y - y.mean()
        gram = z.T @ z + alpha * np.eye(z.shape[1])
        coef = np.linalg.solve(gram, z.T @ target)
        return cls(coef, float(y.mean()), center, scale)

    def predict(self, x: npt.ArrayLike) -> FloatArray:
        rows = np.atleast_2d(np.asarray(x, dtype=np.float64))
        raw = ((rows - self.center) / self.scale) @ self.coef + self.intercept
        result: FloatArray = np.clip(raw, *CLIP)
        return result

    def predict_with_spread(self, x: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        mean = self.predict(x)
        return mean, np.zeros_like(mean)

    def to_json(self) -> dict[str, Any]:
        return {
            "alpha": RIDGE_ALPHA,
            "coef": [float(v) for v in self.coef],
            "intercept": self.intercept,
            "center": [float(v) for v in self.center],
            "scale": [float(v) for v in self.scale],
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> LinearModel:
        return cls(
            np.asarray(body["coef"], dtype=np.float64),
            float(body["intercept"]),
            np.asarray(body["center"], dtype=np.float64),
            np.asarray(body["scale"], dtype=np.float64),
        )
