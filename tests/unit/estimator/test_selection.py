"""The pieces of the transferring gate on small hand-made arrays: the monotone base, and the
choice of what the gate decides on (simplest within one standard error, consistent gains,
never behind a rule)."""

from __future__ import annotations

import numpy as np

from agent.estimator.pressure import Monotone
from agent.estimator.selection import Candidate, choose

NAMES = ["x.util_sum", "x.dram_total", "t.gpu_util"]
FAMILIES = np.repeat([f"f{i}" for i in range(10)], 60)


def test_the_base_never_rises_with_pressure_and_names_the_term_that_weighs_most() -> None:
    base = Monotone(
        ["util_sum", "bandwidth_sum"],
        np.asarray([1.0, 2.0]),
        np.asarray([0.5, 1.0, 2.0]),
        np.asarray([1.0, 0.9, 0.3]),
    )
    rows = np.asarray([[50.0, 0.1, 0.0], [100.0, 0.1, 0.0], [100.0, 0.6, 0.0], [180.0, 0.2, 0.0]])
    predicted = base.predict(rows, NAMES)
    assert predicted[0] >= predicted[1] >= predicted[2]  # more of either term never helps
    assert base.driving_terms(rows, NAMES) == [
        "util_sum",
        "util_sum",
        "bandwidth_sum",
        "util_sum",
    ]
    again = Monotone.from_json(base.to_json())
    assert np.array_equal(again.predict(rows, NAMES), predicted)


def _truth(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.6, 1.0, FAMILIES.size)


def _candidate(name: str, mean: np.ndarray, order: int) -> Candidate:
    return Candidate(name, mean, np.zeros_like(mean), order)


def _choose(*candidates: Candidate, truth: np.ndarray) -> str:
    return choose(list(candidates), truth, FAMILIES, FAMILIES, 0.85, 0.95).name


def test_the_simplest_estimate_within_one_standard_error_is_kept() -> None:
    truth = _truth(1)
    noise = np.random.default_rng(2).normal(0, 0.02, truth.size)
    # the correction ranks a little better, by less than its spread across families
    corrected = truth + noise * 0.9
    base = truth + noise
    assert (
        _choose(_candidate("base", base, 1), _candidate("corrected@1.0", corrected, 2), truth=truth)
        == "base"
    )


def test_a_correction_that_helps_some_families_by_hurting_others_is_not_kept() -> None:
    truth = _truth(3)
    rng = np.random.default_rng(4)
    base = truth + rng.normal(0, 0.04, truth.size)
    corrected = truth + rng.normal(0, 0.005, truth.size)
    hurt = np.isin(FAMILIES, ["f0", "f1", "f2"])  # wrong for three families of ten
    corrected[hurt] = truth[hurt][::-1]
    picked = _choose(
        _candidate("base", base, 1), _candidate("corrected@1.0", corrected, 2), truth=truth
    )
    assert picked == "base"


def test_a_correction_that_helps_every_family_is_kept() -> None:
    truth = _truth(5)
    rng = np.random.default_rng(6)
    base = truth + rng.normal(0, 0.06, truth.size)
    corrected = truth + rng.normal(0, 0.005, truth.size)
    picked = _choose(
        _candidate("base", base, 1), _candidate("corrected@1.0", corrected, 2), truth=truth
    )
    assert picked == "corrected@1.0"


def test_a_rule_that_admits_more_held_out_is_what_the_gate_decides_on() -> None:
    truth = _truth(7)
    rng = np.random.default_rng(8)
    rule = truth + rng.normal(0, 0.005, truth.size)
    base = truth + rng.normal(0, 0.06, truth.size)
    choice = choose(
        [_candidate("rule:util_sum", rule, 0), _candidate("base", base, 1)],
        truth,
        FAMILIES,
        FAMILIES,
        0.85,
        0.95,
    )
    assert choice.name == "rule:util_sum" and choice.reached
    assert choice.judged["rule:util_sum"].recall > choice.judged["base"].recall


def test_where_nothing_keeps_the_precision_the_choice_says_so() -> None:
    truth = _truth(9)
    noise = np.random.default_rng(10).uniform(0.6, 1.0, truth.size)  # says nothing
    choice = choose([_candidate("base", noise, 1)], truth, FAMILIES, FAMILIES, 0.85, 0.95)
    assert not choice.reached and "came closest" in choice.reason
