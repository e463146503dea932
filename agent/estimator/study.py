"""The gate judged in nested cross-validation over groups of like workload families: what
``bench/estimator.py --gate`` prints and the never-dominated tests assert. Training's own
out-of-family estimates are reused (``training.prepare``), so the study costs one training.

For each group of like families in turn (``transfer.like_groups``), the gate's estimate and
its threshold are chosen from the other groups alone (``selection.choose``, then the
operating point's column as the model picks it) and applied to the group; each one-line
rule and the monotone base are scored the same way, their thresholds from the same inner
loop. The inner loop reads the other groups' out-of-family estimates, each made by models
fitted without that group but with the outer one: the outer group's labels choose nothing
for it, its records did train models that scored the others (nested in what is chosen,
not in what is fitted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agent.estimator.operating import DEFAULT_PRECISION
from agent.estimator.records import Record
from agent.estimator.selection import nested
from agent.estimator.training import CHOICE_FLOOR, prepare


def nested_gate(
    records: Sequence[Record],
    *,
    trees: int = 40,
    seed: int = 0,
    floor: float = CHOICE_FLOOR,
    precision: float = DEFAULT_PRECISION,
) -> dict[str, Any]:
    """Held-out precision, recall and worst fifth of families' precision of the gate, of
    each applicable rule (``rule:<term>``) and of the base; ``picked``: the gate's choice per
    outer group; ``best_rule``: the rule with the most held-out recall at the precision."""
    p = prepare(records, 0, trees, seed, check_constraints=False)
    options = p.options()
    report = [n for n in options if n.startswith("rule:")] + ["base"]
    figures = nested(
        list(options.values()),
        p.y,
        np.asarray(p.alike),
        np.asarray(p.groups),
        floor,
        precision,
        report,
    )
    rules = [n for n in report if n.startswith("rule:")]
    kept = [n for n in rules if (figures[n]["heldout_precision"] or 0.0) >= precision - 0.01]
    best = max(kept or rules, key=lambda n: figures[n]["heldout_recall"], default=None)
    figures["best_rule"] = best
    figures["groups"] = len(set(p.alike))
    figures["families"] = len(set(p.groups))
    return figures
