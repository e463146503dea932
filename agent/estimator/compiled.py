"""A Random Forest compiled into flat arrays, predicted with numpy alone.

Every tree's nodes are laid end to end (``left``, ``right``, ``feature``, ``threshold``,
``value``), and a whole batch walks all trees at once: one gather per level, no Python loop
over trees or records, no scikit-learn on the hot path. Inputs are rounded to float32 first,
as scikit-learn's trees do, so predictions equal ``RandomForestRegressor.predict`` exactly
(tested to 1e-9). The spread of the trees feeds the calibrated lower estimate
(``agent.estimator.calibration``); version 1 models used a quantile of the trees.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class CompiledForest:
    left: npt.NDArray[np.int64]  # global index of the left child; -1 at a leaf
    right: npt.NDArray[np.int64]
    feature: npt.NDArray[np.int64]
    threshold: FloatArray
    value: FloatArray  # the leaf's prediction (any node's mean)
    roots: npt.NDArray[np.int64]  # global index of each tree's root
    depth: int

    @classmethod
    def from_sklearn(cls, forest: Any, *, value_column: int = 0) -> CompiledForest:
        """From a fitted RandomForestRegressor, or (``value_column`` = the class's index) the
        probability of one class of a RandomForestClassifier."""
        lefts, rights, features, thresholds, values, roots = [], [], [], [], [], []
        offset, depth = 0, 0
        for estimator in forest.estimators_:
            tree = estimator.tree_
            leaf = tree.children_left == -1
            lefts.append(np.where(leaf, -1, tree.children_left + offset))
            rights.append(np.where(leaf, -1, tree.children_right + offset))
            features.append(np.where(leaf, 0, tree.feature))
            thresholds.append(tree.threshold.astype(np.float64))
            values.append(tree.value[:, 0, value_column].astype(np.float64))
            roots.append(offset)
            offset += tree.node_count
            depth = max(depth, int(tree.max_depth))
        return cls(
            np.concatenate(lefts).astype(np.int64),
            np.concatenate(rights).astype(np.int64),
            np.concatenate(features).astype(np.int64),
            np.concatenate(thresholds),
            np.concatenate(values),
            np.asarray(roots, dtype=np.int64),
            depth,
        )

    def tree_predictions(self, x: npt.ArrayLike) -> FloatArray:
        """Each tree's prediction for each row: shape (rows, trees)."""
        rows = np.asarray(x, dtype=np.float32).astype(np.float64)
        if rows.ndim == 1:
            rows = rows[None, :]
        node = np.broadcast_to(self.roots, (rows.shape[0], self.roots.size)).copy()
        row_index = np.arange(rows.shape[0])[:, None]
        for _ in range(self.depth):
            left = self.left[node]
            inner = left >= 0
            if not inner.any():
                break
            goes_left = rows[row_index, self.feature[node]] <= self.threshold[node]
            node = np.where(inner, np.where(goes_left, left, self.right[node]), node)
        result: FloatArray = self.value[node]
        return result

    def predict(self, x: npt.ArrayLike) -> FloatArray:
        result: FloatArray = self.tree_predictions(x).mean(axis=1)
        return result

    def predict_with_lower(
        self, x: npt.ArrayLike, *, quantile: float = 0.1
    ) -> tuple[FloatArray, FloatArray]:
        """The mean prediction and a conservative one: the ``quantile`` of the trees."""
        trees = self.tree_predictions(x)
        return trees.mean(axis=1), _lower_quantile(trees, quantile)

    def predict_with_spread(self, x: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """The mean prediction and the trees' spread (population standard deviation), the
        two numbers the calibrated lower estimate is made of."""
        trees = self.tree_predictions(x)
        return trees.mean(axis=1), trees.std(axis=1)

    def save(self, path: Path) -> None:
        np.savez_compressed(
            path,
            left=self.left.astype(np.int32),
            right=self.right.astype(np.int32),
            feature=self.feature.astype(np.int32),
            threshold=self.threshold,
            value=self.value,
            roots=self.roots.astype(np.int32),
            depth=np.asarray([self.depth]),
        )

    @classmethod
    def load(cls, path: Path) -> CompiledForest:
        with np.load(path) as data:
            return cls(
                data["left"].astype(np.int64),
                data["right"].astype(np.int64),
                data["feature"].astype(np.int64),
                data["threshold"],
                data["value"],
                data["roots"].astype(np.int64),
                int(data["depth"][0]),
            )


def _lower_quantile(trees: FloatArray, quantile: float) -> FloatArray:
    """``np.quantile(trees, quantile, axis=1)`` (linear interpolation) by a partial sort:
    the agent asks for it on every admission."""
    count = trees.shape[1]
    position = quantile * (count - 1)
    below = int(np.floor(position))
    above = min(below + 1, count - 1)
    parted = np.partition(trees, (below, above), axis=1)
    low, high = parted[:, below], parted[:, above]
    result: FloatArray = low + (high - low) * (position - below)
    return result
