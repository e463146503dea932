"""The gate's operating point: P(retention >= floor) and the threshold on it that reaches a
stated precision. Pure numpy.

**The probability.** Grouped cross-validation gives every training record a prediction
``m`` and a doubt ``s`` (the spread of the forest's trees; 0 for a linear model) from a
model that never saw its workload family, and so a score ``(m - y) / (s + eps)`` (the
conformity of ``calibration``). The scores' distribution is a predictive distribution for
a new record (conformal predictive distribution):

    P(retention >= floor) = F((m - floor) / (s + eps))

with ``F`` the scores' cumulative distribution, stored as its quantiles at ``CDF_LEVELS``
and read by interpolation. One distribution, not one per band of ``m`` as the lower
estimate's: P(keep) then orders sets as ``(m - floor) / (s + eps)`` does, and banded
distributions, each steeper or flatter, broke that order at the band edges and cost the
gate recall at the same precision (on the synthetic worlds, 3 to 5 points).

**The threshold.** For each floor of ``FLOORS`` and each precision of ``PRECISIONS``,
training computes every record's probability from its out-of-family estimate (and the
distribution of all out-of-family scores: a monotone map, so the threshold is one on
``(m - floor) / (s + eps)``), and picks the lowest threshold whose admitted records
(probability at or above it) keep the floor in at least that share: the most recall at
that precision.
Where no threshold reaches it, the gate admits nothing at that floor (``None``). Whether
the precision holds on a family the threshold never saw is measured too
(``heldout_precision``): each family's threshold is chosen from the other families.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.estimator import calibration as cal

FloatArray = npt.NDArray[np.float64]
CDF_LEVELS = tuple(round(0.005 * i, 3) for i in range(201))
FLOORS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99)
PRECISIONS = tuple(round(0.8 + 0.01 * i, 2) for i in range(20))
DEFAULT_PRECISION = 0.95


def cdf_quantiles(scores: npt.ArrayLike) -> list[float]:
    """The scores' quantiles at ``CDF_LEVELS``."""
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        return [0.0 for _ in CDF_LEVELS]
    return [float(v) for v in np.quantile(values, CDF_LEVELS)]


def p_keep(
    mean: npt.ArrayLike,
    spread: npt.ArrayLike,
    floor: npt.ArrayLike,
    quantiles: Sequence[float],
    eps: float,
) -> FloatArray:
    """P(retention >= floor) for each row (``floor``: one value, or one per row)."""
    m, s = np.asarray(mean, dtype=np.float64), np.asarray(spread, dtype=np.float64)
    z = (m - np.asarray(floor, dtype=np.float64)) / (s + eps)
    result: FloatArray = np.interp(z, np.asarray(quantiles), np.asarray(CDF_LEVELS))
    return result


def p_keep_by_floor(
    truth: FloatArray, mean: FloatArray, spread: FloatArray, eps: float
) -> dict[float, FloatArray]:
    """Each record's P(retention >= floor) at every floor of ``FLOORS``, from its
    out-of-family estimate and the distribution of every out-of-family score (P(keep) is a
    monotone map of ``(m - floor) / (s + eps)``, so a threshold on it is one on that)."""
    table = cdf_quantiles(cal.conformity(truth, mean, spread, eps))
    return {floor: p_keep(mean, spread, floor, table, eps) for floor in FLOORS}


def threshold_for(
    p: FloatArray, good: npt.NDArray[np.bool_], precision: float
) -> tuple[float | None, float, float]:
    """The lowest threshold on ``p`` whose admitted records are ``good`` in at least
    ``precision`` of cases, with that precision and its recall; (None, 1.0, 0.0) where no
    threshold reaches it."""
    order = np.argsort(-p, kind="stable")
    ps, hits = p[order], good[order].astype(np.float64)
    cumulative = np.cumsum(hits) / np.arange(1, p.size + 1)
    # only cut between distinct probabilities: ties are admitted together
    last_of_tie = np.append(ps[1:] != ps[:-1], True)
    reach = np.nonzero((cumulative >= precision - 1e-12) & last_of_tie)[0]
    if reach.size == 0:
        return None, 1.0, 0.0
    k = int(reach.max())
    recall = float(hits[: k + 1].sum() / max(1.0, hits.sum()))
    return float(ps[k]), float(cumulative[k]), recall


def admitted(p: npt.ArrayLike, threshold: float | None) -> npt.NDArray[np.bool_]:
    values = np.asarray(p, dtype=np.float64)
    if threshold is None:
        return np.zeros(values.shape, dtype=bool)
    result: npt.NDArray[np.bool_] = values >= threshold
    return result


def operating_points(
    truth: FloatArray, by_floor: Mapping[float, FloatArray], groups: Sequence[str]
) -> dict[str, Any]:
    """Thresholds for every floor and precision, their precision and recall in grouped
    cross-validation, and the precision and recall when each family's threshold is chosen
    without it (``heldout_*``): rows floors, columns precisions."""
    labels = np.asarray(groups)
    table: dict[str, list[list[Any]]] = {
        key: []
        for key in (
            "threshold",
            "cv_precision",
            "cv_recall",
            "heldout_precision",
            "heldout_recall",
            "heldout_precision_se",
        )
    }
    for floor in FLOORS:
        p, good = by_floor[floor], truth >= floor
        rows = [threshold_for(p, good, precision) for precision in PRECISIONS]
        table["threshold"].append([r[0] for r in rows])
        table["cv_precision"].append([r[1] for r in rows])
        table["cv_recall"].append([r[2] for r in rows])
        held = [_heldout(p, good, labels, precision) for precision in PRECISIONS]
        table["heldout_precision"].append([h[0] for h in held])
        table["heldout_recall"].append([h[1] for h in held])
        table["heldout_precision_se"].append([h[2] for h in held])
    return {"floors": list(FLOORS), "precisions": list(PRECISIONS), **table}


def _heldout(
    p: FloatArray, good: npt.NDArray[np.bool_], labels: npt.NDArray[Any], precision: float
) -> tuple[float | None, float, float]:
    """Precision (None: nothing was admitted, so nothing was shown) and recall when each
    family's threshold is chosen from the other families' records, and the standard error
    of that precision across families (``precision_se``)."""
    taken = np.zeros(p.shape, dtype=bool)
    for group in np.unique(labels):
        inside = labels == group
        others = ~inside
        if not others.any():
            continue
        threshold, _p, _r = threshold_for(p[others], good[others], precision)
        taken[inside] = admitted(p[inside], threshold)
    held_precision = float(good[taken].mean()) if taken.any() else None
    held_recall = float(taken[good].mean()) if good.any() else 1.0
    return held_precision, held_recall, precision_se(taken, good, labels)


def precision_se(
    taken: npt.NDArray[np.bool_], good: npt.NDArray[np.bool_], labels: npt.NDArray[Any]
) -> float:
    """The standard error of the held-out precision across families: the spread of each
    family's own precision (of those admitted anything) over the root of their number, 0
    with fewer than two."""
    shown = [
        good[taken & (labels == g)].mean()
        for g in np.unique(labels)
        if (taken & (labels == g)).any()
    ]
    if len(shown) < 2:
        return 0.0
    return float(np.std(shown, ddof=1) / np.sqrt(len(shown)))


def column_for(gate: Mapping[str, Any], row: int, precision: float) -> int:
    """The precision column the gate runs at for floor ``row`` and a wanted precision: the
    lowest stored precision at or above it whose threshold, chosen without each family,
    kept the wanted precision on that family's records (``heldout_precision``; a column that
    admitted nothing held out showed nothing); when none did, the column whose held-out
    precision came closest."""
    precisions = list(gate["precisions"])
    held = gate.get("heldout_precision")
    se = gate.get("heldout_precision_se")
    columns = [c for c, level in enumerate(precisions) if level >= precision - 1e-9]
    columns = columns or [len(precisions) - 1]
    if held is None:
        return columns[0]

    def shown(column: int) -> float:
        value = held[row][column]
        return -1.0 if value is None else float(value)

    if se is not None:  # a margin of one standard error across families, where it holds
        for column in columns:
            if shown(column) - float(se[row][column]) >= precision - 1e-9:
                return column
    for column in columns:
        if shown(column) >= precision - 1e-9:
            return column
    return max(columns, key=lambda c: (shown(c), -c))


def threshold_at(gate: Mapping[str, Any], floor: float, precision: float) -> float | None:
    """The threshold for a floor and a precision (see ``column_for``); a floor between two
    stored floors takes the more demanding of their thresholds; None: the gate admits
    nothing there."""
    rows = _neighbours(list(gate["floors"]), floor)
    values = [gate["threshold"][row][column_for(gate, row, precision)] for row in rows]
    if any(v is None for v in values):
        return None
    return float(max(values))


def _neighbours(floors: Sequence[float], floor: float) -> list[int]:
    if floor <= floors[0]:
        return [0]
    if floor >= floors[-1]:
        return [len(floors) - 1]
    above = next(i for i, f in enumerate(floors) if f >= floor - 1e-9)
    return [above] if abs(floors[above] - floor) < 1e-9 else [above - 1, above]


def at(
    gate: Mapping[str, Any], key: str, floor: float, precision: float, *, chosen: bool = True
) -> Any:
    """A stored figure (``cv_precision``, ``heldout_recall``, ...) at the stored floor
    nearest ``floor``, in the column the gate runs at for ``precision`` (``chosen=False``:
    in that precision's own column, before the held-out check moved it)."""
    row = min(range(len(gate["floors"])), key=lambda i: abs(gate["floors"][i] - floor))
    if chosen:
        return gate[key][row][column_for(gate, row, precision)]
    precisions = list(gate["precisions"])
    own = next((c for c, v in enumerate(precisions) if v >= precision - 1e-9), -1)
    return gate[key][row][own]
