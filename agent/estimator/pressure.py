"""The aggregate-pressure terms a monotone base reads, and the base itself. Pure.

A term is one column of the features (``features``): how much of the device the set wants
together. A term whose inputs the records do not carry (its column constant in training:
no L2 counters, no ``gpu_util``) is absent. The base is ``g(w . terms)``: a pressure index
with non-negative weights and a non-increasing ``g`` (isotonic), so more of any term never
raises the estimate; a rule is the same with one term and weight 1. A tie-break of
``TIE`` per unit of index keeps the order of the index where ``g`` is flat, so a threshold
on the estimate is one on the index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
# term -> (feature column, scale to a fraction of the device)
TERMS: dict[str, tuple[str, float]] = {
    "util_sum": ("x.util_sum", 0.01),
    "sm_sum": ("x.sm_total", 1.0),
    "bandwidth_sum": ("x.dram_total", 1.0),
    "memsys_sum": ("x.memsys_total", 1.0),
    "threads_over": ("x.threads_over", 1.0),
    "memory_frac": ("x.mem_total", 1.0),
}
# The one-line rules an operator writes: each a term alone, admitted under a limit.
RULES = ("util_sum", "bandwidth_sum", "memsys_sum")
TIE = 1e-6


def present_terms(x: FloatArray, names: Sequence[str]) -> list[str]:
    """The terms whose column is among ``names`` and varies in ``x``."""
    found = []
    for term, (column, _scale) in TERMS.items():
        if column in names and np.ptp(x[:, list(names).index(column)]) > 1e-12:
            found.append(term)
    return found


def term_values(x: npt.ArrayLike, names: Sequence[str], terms: Sequence[str]) -> FloatArray:
    """Rows x terms, each scaled to a fraction of the device."""
    rows = np.atleast_2d(np.asarray(x, dtype=np.float64))
    columns = [list(names).index(TERMS[t][0]) for t in terms]
    scales = np.asarray([TERMS[t][1] for t in terms], dtype=np.float64)
    result: FloatArray = rows[:, columns] * scales
    return result


@dataclass(frozen=True)
class Monotone:
    """``g(w . terms)``, ``g`` non-increasing and piecewise linear between its knots."""

    terms: list[str]
    weights: FloatArray
    knots_x: FloatArray
    knots_y: FloatArray

    def index(self, x: npt.ArrayLike, names: Sequence[str]) -> FloatArray:
        result: FloatArray = term_values(x, names, self.terms) @ self.weights
        return result

    def from_index(self, index: FloatArray) -> FloatArray:
        result: FloatArray = np.interp(index, self.knots_x, self.knots_y) - TIE * index
        return result

    def predict(self, x: npt.ArrayLike, names: Sequence[str]) -> FloatArray:
        return self.from_index(self.index(x, names))

    def to_json(self) -> dict[str, Any]:
        return {
            "terms": list(self.terms),
            "weights": [float(v) for v in self.weights],
            "knots_x": [float(v) for v in self.knots_x],
            "knots_y": [float(v) for v in self.knots_y],
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Monotone:
        return cls(
            list(body["terms"]),
            np.asarray(body["weights"], dtype=np.float64),
            np.asarray(body["knots_x"], dtype=np.float64),
            np.asarray(body["knots_y"], dtype=np.float64),
        )

    def contributions(self, x: npt.ArrayLike, names: Sequence[str]) -> FloatArray:
        """Each term's part of the index (rows x terms): which term drove a refusal."""
        result: FloatArray = term_values(x, names, self.terms) * self.weights
        return result

    def driving_terms(self, x: npt.ArrayLike, names: Sequence[str]) -> list[str]:
        """Per row, the term with the largest part of the index: what a refusal names."""
        share = self.contributions(x, names)
        return [self.terms[int(i)] for i in np.argmax(share, axis=1)]
