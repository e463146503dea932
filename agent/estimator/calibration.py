"""A conservative retention estimate with a stated coverage (split-conformal, by group). Pure.

The forest's mean ``m`` and the spread of its trees ``s`` (standard deviation) give, for a
record whose true retention is ``y``, the score ``(m - y) / (s + eps)``: how far the truth
fell under the mean, in units of the forest's own doubt. Scores come from grouped
cross-validation, each made by a forest that never saw the record's workload family. The
``c`` quantile ``q_c`` of those scores gives the lower estimate

    retention_lower = m - q_c * (s + eps)

which the truth meets for a share ``c`` (the *coverage*) of co-locations like the ones
scored. The quantile is taken separately in bands of the predicted mean (``EDGES``: under
0.6, 0.6-0.8, 0.8-0.9, 0.9 and over; a band with fewer than ``MIN_BAND`` scores uses all of
them), so the coverage holds near the floors the gate decides at, not only on average: the
forest errs more on sets it predicts to lose a third of their speed than on sets it predicts
to keep nearly all of it. The model stores ``q`` for every level from 0.50 to 0.99
(``LEVELS``), so the gate can be run at any coverage in that range (the setting
``estimator.coverage``) without retraining. Whether the claim holds for unseen families
is measured, not assumed: ``grouped_coverage`` recomputes the quantile without each
family in turn and counts how often that family's records are covered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
LEVELS = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))
DEFAULT_COVERAGE = 0.9
MIN_EPS = 0.01
EDGES = (0.6, 0.8, 0.9)
MIN_BAND = 50


def eps_of(spread: npt.ArrayLike) -> float:
    """The floor added to the spread: its median (at least ``MIN_EPS``), so a record on
    which every tree agrees still gets a margin."""
    values = np.asarray(spread, dtype=np.float64)
    return max(MIN_EPS, float(np.median(values))) if values.size else MIN_EPS


def conformity(
    truth: npt.ArrayLike, mean: npt.ArrayLike, spread: npt.ArrayLike, eps: float
) -> FloatArray:
    t, m, s = (np.asarray(v, dtype=np.float64) for v in (truth, mean, spread))
    result: FloatArray = (m - t) / (s + eps)
    return result


def quantiles(scores: npt.ArrayLike, levels: Sequence[float] = LEVELS) -> list[float]:
    """The finite-sample conformal quantile at each level: the ``ceil((n + 1) c)``-th
    smallest score (the largest when that passes ``n``)."""
    ordered = np.sort(np.asarray(scores, dtype=np.float64))
    n = ordered.size
    if n == 0:
        return [0.0 for _ in levels]
    return [float(ordered[min(n, math.ceil((n + 1) * c)) - 1]) for c in levels]


def band_of(mean: npt.ArrayLike, edges: Sequence[float] = EDGES) -> npt.NDArray[np.int64]:
    """The band of each predicted mean: 0 under ``edges[0]``, ..., ``len(edges)`` at or over
    the last."""
    result: npt.NDArray[np.int64] = np.searchsorted(
        np.asarray(edges, dtype=np.float64), np.asarray(mean, dtype=np.float64), side="right"
    ).astype(np.int64)
    return result


def band_quantiles(
    scores: npt.ArrayLike,
    bands: npt.ArrayLike,
    levels: Sequence[float] = LEVELS,
    count: int = len(EDGES) + 1,
) -> list[list[float]]:
    """``quantiles`` per band (rows: bands, columns: levels), from all scores for a band
    with fewer than ``MIN_BAND``."""
    s, b = np.asarray(scores, dtype=np.float64), np.asarray(bands)
    overall = quantiles(s, levels)
    return [
        quantiles(s[b == band], levels) if np.sum(b == band) >= MIN_BAND else overall
        for band in range(count)
    ]


def lower(
    mean: npt.ArrayLike,
    spread: npt.ArrayLike,
    q: npt.ArrayLike,
    eps: float,
    edges: Sequence[float] = EDGES,
) -> npt.NDArray[np.float64]:
    """``m - q[band of m] * (s + eps)``; ``q`` holds one value per band."""
    m, s = np.asarray(mean, dtype=np.float64), np.asarray(spread, dtype=np.float64)
    per_band = np.asarray(q, dtype=np.float64)
    result: npt.NDArray[np.float64] = m - per_band[band_of(m, edges)] * (s + eps)
    return result


def grouped_coverage(
    truth: npt.ArrayLike,
    mean: npt.ArrayLike,
    spread: npt.ArrayLike,
    groups: Sequence[str],
    eps: float,
    levels: Sequence[float] = LEVELS,
) -> tuple[list[float], FloatArray]:
    """Achieved coverage at each level when each group's quantiles come from the other
    groups' scores only, and the lower estimates made that way (rows x levels)."""
    scores = conformity(truth, mean, spread, eps)
    t = np.asarray(truth, dtype=np.float64)
    m, s = np.asarray(mean, dtype=np.float64), np.asarray(spread, dtype=np.float64)
    bands = band_of(m)
    labels = np.asarray(groups)
    bounds = np.zeros((t.size, len(levels)))
    for group in np.unique(labels):
        inside = labels == group
        others = ~inside if (~inside).any() else inside
        qs = np.asarray(band_quantiles(scores[others], bands[others], levels))
        bounds[inside] = m[inside, None] - qs[bands[inside]] * (s[inside, None] + eps)
    covered = t[:, None] >= bounds
    return [float(v) for v in covered.mean(axis=0)], bounds


def table(
    scores: npt.ArrayLike, mean: npt.ArrayLike, eps: float, coverage: float
) -> dict[str, Any]:
    """What a model stores: the coverage the gate uses, eps, the bands and q at every level
    in every band."""
    return {
        "method": "split-conformal by band of the prediction; scores from grouped "
        "cross-validation by workload family",
        "coverage": coverage,
        "eps": eps,
        "edges": list(EDGES),
        "levels": list(LEVELS),
        "q": band_quantiles(scores, band_of(mean)),
    }


def q_at(calibration: Mapping[str, Any], coverage: float) -> FloatArray:
    """The stored q of each band at a coverage (one of the levels, or interpolated)."""
    levels = np.asarray(calibration["levels"], dtype=np.float64)
    if not levels[0] - 1e-9 <= coverage <= levels[-1] + 1e-9:
        raise ValueError(f"coverage must be within [{levels[0]}, {levels[-1]}] (got {coverage})")
    rows = np.asarray(calibration["q"], dtype=np.float64)
    return np.asarray([np.interp(coverage, levels, row) for row in rows], dtype=np.float64)
