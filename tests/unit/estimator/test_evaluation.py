"""Scoring gates and the utilisation-sum baselines."""

import pytest

from agent.estimator.evaluation import baselines, precision_recall, rule_of_sum, util_rule_applies
from agent.estimator.records import Record, Workload, family_of


@pytest.mark.parametrize(
    ("truth", "admitted", "floor", "expected"),
    [
        ([0.9, 0.9, 0.5, 0.5], [1, 0, 1, 0], 0.85, (0.5, 0.5)),
        ([0.9, 0.9, 0.5], [1, 1, 0], 0.85, (1.0, 1.0)),
        ([0.9, 0.5], [0, 0], 0.85, (1.0, 0.0)),  # nothing admitted: precision 1 by convention
        ([0.5, 0.5], [1, 0], 0.85, (0.0, 1.0)),  # nothing good: recall 1 by convention
        ([0.85], [1], 0.85, (1.0, 1.0)),  # at the floor counts as keeping it
    ],
)
def test_precision_and_recall(
    truth: list[float], admitted: list[int], floor: float, expected: tuple[float, float]
) -> None:
    assert precision_recall(truth, admitted, floor) == expected


@pytest.mark.parametrize(("total", "kept"), [(0, 1.0), (100, 1.0), (125, 0.8), (200, 0.5)])
def test_the_rule_of_the_sum(total: float, kept: float) -> None:
    assert rule_of_sum(total) == kept


def pair(a: float, b: float, retention: float) -> Record:
    return Record(
        "L4",
        24 * 2**30,
        Workload("a", 100, 0, {"gpu_util": a}),
        (Workload("b", 100, 0, {"gpu_util": b}),),
        retention=retention,
    )


def test_the_120_percent_rule_admits_on_the_sum_alone() -> None:
    records = [pair(50, 60, 0.95), pair(60, 70, 0.9), pair(30, 40, 0.7)]
    rule = baselines(records, [r.retention for r in records])["util_sum_120"]
    # admitted: 110% and 70%; the 130% set is refused though it kept 0.9
    assert rule["gate_precision_at_0.85"] == 0.5 and rule["gate_recall_at_0.85"] == 0.5


def test_the_best_limit_is_the_highest_sum_that_reaches_the_precision() -> None:
    records = [pair(30, 40, 0.95), pair(50, 50, 0.9), pair(60, 60, 0.9), pair(70, 80, 0.5)]
    best = baselines(records, [r.retention for r in records], precision=0.95)["util_sum_best"]
    # sum <= 120 admits the three good sets; 150 would let the bad one in
    assert best["limit_at_0.85"] == 120 and best["gate_recall_at_0.85"] == 1.0
    assert best["gate_precision_at_0.85"] == 1.0


def test_no_gpu_util_no_utilisation_rule() -> None:
    bare = Record(
        "L4",
        24 * 2**30,
        Workload("a", 50, 0, {"l2_util": 40.0, "dram_util": 30.0}),
        (Workload("b", 50, 0, {"l2_util": 20.0, "dram_util": 60.0}),),
        retention=0.7,
    )
    assert not util_rule_applies([bare]) and not util_rule_applies([pair(50, 50, 0.9), bare])
    assert util_rule_applies([pair(50, 50, 0.9)]) and not util_rule_applies([])
    assert set(baselines([bare], [0.7])) == {"admit_all"}
    assert set(baselines([pair(1, 2, 0.9)], [0.9])) == {
        "admit_all",
        "util_sum_rule",
        "util_sum_120",
        "util_sum_best",
    }


@pytest.mark.parametrize(
    ("name", "family", "expected"),
    [
        ("resnet50-bs32", "", "resnet50"),
        ("lstm-bs64", "", "lstm"),
        ("bert_b16", "", "bert"),
        ("ResNet-50 (batch size 128)", "", "resnet-50"),
        ("w07", "", "w07"),
        ("anything", "vision", "vision"),
    ],
)
def test_family_of_a_workload(name: str, family: str, expected: str) -> None:
    assert family_of(Workload(name, 100, 0, {}, family)) == expected
