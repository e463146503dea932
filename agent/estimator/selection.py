"""Choosing what the gate decides on by what transfers to families it never saw. Pure numpy.

Every candidate gives each training record an out-of-family estimate and doubt (each
applicable one-line rule as an isotonic of its term alone, the monotone base, the base
plus a share of the forest's correction, as a point or with the trees' spread, and the
model's reported estimate), hence a score ``(m - floor) / (s + eps)``, of which the gate's
``p_keep`` is a monotone map. A candidate is judged the way a new family meets it: the
threshold for each group of like families (``transfer.like_groups``) is chosen on the
other groups and applied to it, each family's admitted good and bad sets counted, at the
precision column the model's operating point would take (the lowest at or above the
wanted precision whose held-out precision, less one standard error across groups,
reaches it; else the lowest whose held-out precision does).

- **Simplest within one standard error**, among the candidates reaching the precision, in
  the order rules (most recall first), base, correction at rising shares, with the trees'
  spread, the reported estimate: the first whose per-family recall is within one standard
  error of the best's (the mean of the per-family differences at most their standard
  error). A correction must also keep the worst fifth of families as precise as the base
  (less ``WORST_SLACK``) and not cost the fifth of families it helps least more than
  ``WORST_GAIN_SLACK`` of their recall against the base: it is kept only where it helps
  consistently across families, by more than its spread.
- **Never dominated**: where the best rule reaching the precision admits more than
  ``RULE_MARGIN`` more held out than that choice, the rule is chosen (its limit learned).
- **Nothing reaches the precision**: the learned estimate that came closest, and the
  choice says so.

``study`` judges the whole of training (this choice included) on families it never saw:
the figures ``bench/estimator.py --gate`` prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.estimator import calibration as cal
from agent.estimator.operating import PRECISIONS, threshold_for

FloatArray = npt.NDArray[np.float64]
WORST_SLACK = 0.0  # a correction may not make the worst fifth of families less precise
RULE_MARGIN = 0.01  # a rule replaces a learned estimate that admits less by more than this
# a correction may cost the fifth of families it helps least this much recall against the base
WORST_GAIN_SLACK = 0.1
SHRINKS = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Candidate:
    name: str  # "rule:<term>", "base", "linear", "corrected@<share>", "forest", ...
    mean: FloatArray
    spread: FloatArray
    order: int  # simplest first

    @property
    def rule(self) -> bool:
        return self.name.startswith("rule:")

    def score(self, floor: float) -> FloatArray:
        eps = cal.eps_of(self.spread)
        result: FloatArray = (self.mean - floor) / (self.spread + eps)
        return result


@dataclass
class Judged:
    recall: float
    precision: float | None
    worst_fifth_precision: float | None
    per_family_recall: dict[str, float] = field(default_factory=dict)
    reached: bool = False  # its held-out precision reached the wanted one

    def to_json(self) -> dict[str, Any]:
        return {
            "heldout_recall": self.recall,
            "heldout_precision": self.precision,
            "worst_fifth_precision": self.worst_fifth_precision,
        }


@dataclass
class Choice:
    name: str
    reached: bool
    reason: str
    judged: dict[str, Judged]

    def best_rule(self) -> str | None:
        """The rule with the most held-out recall among those keeping the precision (else
        among all)."""
        rules = [n for n in self.judged if n.startswith("rule:")]
        kept = [n for n in rules if self.judged[n].reached] or rules
        return max(kept, key=lambda n: self.judged[n].recall) if kept else None


def counts(
    score: FloatArray,
    good: npt.NDArray[np.bool_],
    families: npt.NDArray[Any],
    groups: npt.NDArray[Any],
    precision: float,
) -> dict[str, tuple[int, int, int]]:
    """Per family: (good admitted, bad admitted, good), the threshold for each group of
    like families chosen on the other groups."""
    result = {}
    for group in np.unique(groups):
        inside = groups == group
        threshold, _p, _r = threshold_for(score[~inside], good[~inside], precision)
        taken = score >= threshold if threshold is not None else np.zeros(score.shape, bool)
        for family in np.unique(families[inside]):
            at = inside & (families == family)
            g = good[at]
            result[str(family)] = (
                int((taken[at] & g).sum()),
                int((taken[at] & ~g).sum()),
                int(g.sum()),
            )
    return result


def judge(table: dict[str, tuple[int, int, int]]) -> Judged:
    good_in = sum(a for a, _b, _g in table.values())
    bad_in = sum(b for _a, b, _g in table.values())
    goods = sum(g for _a, _b, g in table.values())
    recall = good_in / goods if goods else 1.0
    precision = good_in / (good_in + bad_in) if good_in + bad_in else None
    return Judged(recall, precision, worst_fifth(table), per_family(table))


def per_family(table: dict[str, tuple[int, int, int]]) -> dict[str, float]:
    return {f: a / g for f, (a, _b, g) in table.items() if g > 0}


def worst_fifth(table: dict[str, tuple[int, int, int]]) -> float | None:
    """Pooled precision of the fifth of families (at least one) the gate was least precise
    on, among those it admitted anything of."""
    shown = sorted((a / (a + b), a, b) for a, b, _g in table.values() if a + b)
    if not shown:
        return None
    worst = shown[: max(1, math.ceil(len(shown) / 5))]
    return sum(a for _p, a, _b in worst) / sum(a + b for _p, a, b in worst)


def judged_at_precision(
    score: FloatArray,
    good: npt.NDArray[np.bool_],
    families: npt.NDArray[Any],
    groups: npt.NDArray[Any],
    precision: float,
) -> Judged:
    """A candidate judged at the precision column its operating point would take (see
    ``operating.column_for``: the lowest at or above the wanted precision whose held-out
    precision, less one standard error across groups, reaches it; else the lowest whose
    held-out precision does): candidates are compared at the precision they keep, not at
    the one they aim for. Where no column reaches it, at the wanted column."""
    found = _by_column(score, good, families, groups, precision)
    at = _column(found, precision)
    if at is None:
        return found[0][1]
    found[at][1].reached = True
    return found[at][1]


def _by_column(
    score: FloatArray,
    good: npt.NDArray[np.bool_],
    families: npt.NDArray[Any],
    groups: npt.NDArray[Any],
    precision: float,
) -> list[tuple[float, Judged, float]]:
    """(column, judged, standard error of the precision across groups) per column."""
    columns = [c for c in PRECISIONS if c >= precision - 1e-9] or [PRECISIONS[-1]]
    group_of = {str(f): str(g) for f, g in zip(families, groups, strict=True)}
    found = []
    for column in columns:
        table = counts(score, good, families, groups, column)
        by_group: dict[str, list[int]] = {}
        for family, (a, b, _g) in table.items():
            pair = by_group.setdefault(group_of[family], [0, 0])
            pair[0], pair[1] = pair[0] + a, pair[1] + a + b
        shown = [a / t for a, t in by_group.values() if t]
        se = float(np.std(shown, ddof=1) / math.sqrt(len(shown))) if len(shown) > 1 else 0.0
        found.append((column, judge(table), se))
    return found


def _column(found: list[tuple[float, Judged, float]], precision: float) -> int | None:
    for margin in (True, False):
        for at, (_column_level, judged, se) in enumerate(found):
            shown = judged.precision
            if shown is not None and shown - (se if margin else 0.0) >= precision - 1e-9:
                return at
    return None


def choose(
    candidates: Sequence[Candidate],
    truth: FloatArray,
    families: npt.NDArray[Any],
    groups: npt.NDArray[Any],
    floor: float,
    precision: float,
) -> Choice:
    good = truth >= floor
    judged = {
        c.name: judged_at_precision(c.score(floor), good, families, groups, precision)
        for c in candidates
    }
    learned = sorted((c for c in candidates if not c.rule), key=lambda c: c.order)
    fit = [c.name for c in learned if judged[c.name].reached]
    rules = [c.name for c in candidates if c.rule and judged[c.name].reached]
    best_rule = max(rules, key=lambda n: judged[n].recall) if rules else None
    if not fit and best_rule is None:
        closest = max(
            (c.name for c in learned), key=lambda n: (judged[n].precision or 0.0, judged[n].recall)
        )
        return Choice(
            closest,
            False,
            f"no estimate and no rule kept precision {precision:.2f} on held-out families at "
            f"floor {floor}: the gate decides on {closest}, which came closest",
            judged,
        )
    # simplest first: the rules (the most recall first), then the learned estimates
    ranked = sorted(rules, key=lambda n: -judged[n].recall) + fit
    chosen = _simplest_within_one_se(ranked, judged)
    if best_rule is not None and judged[best_rule].recall > judged[chosen].recall + RULE_MARGIN:
        return Choice(best_rule, True, f"the rule {best_rule[5:]} admits most held out", judged)
    return Choice(chosen, True, f"{chosen}: the simplest within one standard error", judged)


def _simplest_within_one_se(fit: list[str], judged: dict[str, Judged]) -> str:
    """The simplest of ``fit`` (simplest first) whose per-family recall is within one
    standard error of the best's, among the rules, the base and the corrections that keep
    the worst fifth of families as precise as the base does (less ``WORST_SLACK``) and
    whose gain over the base, on the fifth of families it helps least, is no worse than
    ``-WORST_GAIN_SLACK``: a gain on some families bought with a loss on others does not
    carry."""
    base_worst = judged["base"].worst_fifth_precision if "base" in fit else None

    def holds(name: str) -> bool:
        worst = judged[name].worst_fifth_precision
        if name == "base" or name.startswith("rule:") or base_worst is None:
            return True
        gains = _gaps(judged[name], judged["base"])  # per family: its recall less the base's
        least = np.sort(gains)[: max(1, math.ceil(gains.size / 5))].mean() if gains.size else 0.0
        if least < -WORST_GAIN_SLACK:
            return False
        return worst is not None and worst >= base_worst - WORST_SLACK

    kept = [name for name in fit if holds(name)]
    best = max(kept, key=lambda n: judged[n].recall)
    for name in kept:
        gaps = _gaps(judged[best], judged[name])
        if gaps.size < 2 or gaps.mean() <= gaps.std(ddof=1) / math.sqrt(gaps.size) + 1e-12:
            return name
    return best


def _gaps(best: Judged, other: Judged) -> FloatArray:
    shared = sorted(set(best.per_family_recall) & set(other.per_family_recall))
    return np.asarray(
        [best.per_family_recall[f] - other.per_family_recall[f] for f in shared], np.float64
    )


def robust_threshold(
    score: FloatArray,
    good: npt.NDArray[np.bool_],
    families: npt.NDArray[Any],
    groups: npt.NDArray[Any],
    precision: float,
) -> float | None:
    """The threshold the model would store (``judged_at_precision``'s column; where none
    reaches the precision, the one whose held-out precision came closest)."""
    found = _by_column(score, good, families, groups, precision)
    at = _column(found, precision)
    if at is None:
        at = max(range(len(found)), key=lambda i: found[i][1].precision or -1.0)
    return threshold_for(score, good, found[at][0])[0]
