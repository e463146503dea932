"""The readiness predictor's pure parts: metrics, baselines, encoding, ordering, data."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from agent.admission.attributes import readiness_order
from agent.core.errors import ValidationError
from agent.estimator.readiness import (
    LookupRule,
    duration_bin,
    ece,
    encode,
    feature_names,
    pr_auc,
    roc_auc,
    vocabulary,
)
from agent.estimator.readiness_data import ASI_COLUMNS, Dataset, from_asi_csv, to_asi_csv
from agent.sim.readiness_synth import READY_SHARE, generate


@pytest.mark.parametrize("seed", range(5))
def test_roc_and_pr_auc_equal_scikit_learns(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.random(300) < 0.4
    scores = np.round(rng.random(300) + 0.3 * labels, 1)  # rounded: many ties
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores))
    assert pr_auc(labels, scores) == pytest.approx(average_precision_score(labels, scores))


@pytest.mark.parametrize(
    ("scores", "labels", "expected"),
    [
        ([0.05, 0.05, 0.95, 0.95], [0, 0, 1, 1], 0.05),  # confident and right
        ([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1], 0.0),  # calibrated coin
        ([0.9, 0.9], [0, 0], 0.9),  # confident and wrong
        ([1.0, 0.0], [1, 0], 0.0),  # the edges fall in the end bins
    ],
)
def test_expected_calibration_error(
    scores: list[float], labels: list[int], expected: float
) -> None:
    assert ece(labels, scores) == pytest.approx(expected)


def test_lookup_rules_smooth_towards_the_overall_rate_and_know_unseen_pairs() -> None:
    rows = [{"model_type": "llm", "job_type": "dev", "declared_duration_s": 60.0}] * 10
    rows += [{"model_type": "cv", "job_type": "training", "declared_duration_s": 7200.0}] * 10
    labels = [False] * 10 + [True] * 10
    rule = LookupRule.fit("model-x-job", rows, labels, prior=5.0)
    dev, training = rule.predict([rows[0], rows[-1]])
    assert dev == pytest.approx((0 + 5 * 0.5) / 15) and training == pytest.approx(12.5 / 15)
    assert rule.predict([{"model_type": "rec", "job_type": "dev"}])[0] == 0.5
    by_duration = LookupRule.fit("job-x-duration", rows, labels)
    assert by_duration.predict([rows[0]])[0] < by_duration.predict([rows[-1]])[0]
    assert [duration_bin(s) for s in (0, 599, 600, 3600, 86400)] == ["d0", "d0", "d1", "d2", "d4"]


def test_encoding_one_hot_with_unseen_values_setting_nothing() -> None:
    rows = [{"accelerator_model": "A100", "priority": "HP", "job_type": "dev", "model_type": "cv"}]
    vocab = vocabulary(rows)
    x = encode([*rows, {"accelerator_model": "B200", "declared_duration_s": np.e - 1}], vocab)
    names = feature_names(vocab)
    assert x.shape == (2, len(names))
    assert x[0, names.index("accelerator_model=A100")] == 1.0
    assert x[1, : names.index("generative")].sum() == 0.0, "B200 was never seen"
    assert x[1, names.index("declared_duration_s")] == pytest.approx(1.0), "log1p"


@pytest.mark.parametrize(
    ("probabilities", "order"),
    [
        ([0.2, 0.9, 0.5], [1, 2, 0]),
        ([0.5, 0.5, 0.5], [0, 1, 2]),  # ties: arrival order
        ([0.1, 0.7, 0.7, 0.9], [3, 1, 2, 0]),
        ([], []),
    ],
)
def test_readiness_order(probabilities: list[float], order: list[int]) -> None:
    assert readiness_order(probabilities) == order


def test_asi_rows_map_the_nine_attributes_and_never_read_after_the_fact_columns() -> None:
    header = ",".join([*ASI_COLUMNS, "schedule_status", "ready_delay_sec"])
    lines = [
        header,
        "s1,A100,HP,training,genai,true,0.5,2,30,true,true,12",
        "s1,A100,LP,dev,dev,false,1,0.1,,false,false,",
        "s2,L20,Other,other,cv,0,8,1,5,1,true,1",
    ]
    data = from_asi_csv(lines)
    assert data.labels == [True, False, True] and data.groups == ["s1", "s1", "s2"]
    first = data.rows[0]
    assert first["declared_duration_s"] == 7200.0 and first["generative"] == 1.0
    assert first["concurrent_requests"] == 1.0 and data.rows[2]["concurrent_requests"] == 0.0
    assert data.rows[1]["scheduling_delay_s"] == 0.0, "missing: 0"
    assert all("ready_delay" not in k and "schedule_status" not in k for r in data.rows for k in r)


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ("s1,A100,HP,training,genai,maybe,0.5,2,30,true", "line 2: is_genai"),
        ("s1,A100,HP,training,genai,true,-1,2,30,true", "line 2: gpu_request"),
        ("s1,A100,HP,training,genai,true,0.5,x,30,true", "line 2: duration_hours"),
        ("s1,A100,HP,training,genai,true,0.5,2,30,sometimes", "line 2: ready_status"),
    ],
)
def test_bad_asi_rows_name_their_line_and_column(line: str, where: str) -> None:
    with pytest.raises(ValidationError) as error:
        from_asi_csv([",".join(ASI_COLUMNS), line])
    assert error.value.field == where


def test_a_csv_without_the_columns_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"missing ASI columns: .*ready_status"):
        from_asi_csv(["server_id,gpu_request", "s1,1"])


def test_synthetic_jobs_are_calibrated_to_the_published_ready_share() -> None:
    jobs = generate(20_000, seed=3)
    assert np.mean(jobs.probabilities) == pytest.approx(READY_SHARE, abs=0.002)
    assert np.mean(jobs.labels) == pytest.approx(READY_SHARE, abs=0.015)
    again = from_asi_csv(to_asi_csv(Dataset(jobs.rows, jobs.labels, jobs.groups)))
    assert again.labels == jobs.labels and again.groups == jobs.groups
