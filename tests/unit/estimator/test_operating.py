"""The gate's operating point: P(keep) from the predictive distribution, thresholds chosen
for a precision, the column kept on held-out families. Tables."""

import numpy as np
import pytest

from agent.estimator import operating as op


@pytest.mark.parametrize(
    ("p", "good", "precision", "expected"),
    [
        # admit down to 0.6: 3 of 4 good (0.75) is not 0.8; down to 0.7: 3 of 3
        ([0.9, 0.8, 0.7, 0.6], [1, 1, 1, 0], 0.8, (0.7, 1.0, 1.0)),
        ([0.9, 0.8, 0.7, 0.6], [1, 1, 1, 0], 0.75, (0.6, 0.75, 1.0)),
        # the best record is bad: nothing reaches 0.9
        ([0.9, 0.8], [0, 1], 0.9, (None, 1.0, 0.0)),
        # ties are admitted together: 0.8 admits both of its records, 1 of 2 good
        ([0.9, 0.8, 0.8], [1, 1, 0], 0.9, (0.9, 1.0, 0.5)),
        ([0.9, 0.8, 0.8], [1, 1, 0], 0.6, (0.8, 2 / 3, 1.0)),
        # a dip under the precision and back over it: the lowest threshold that reaches it
        ([0.9, 0.8, 0.7, 0.6, 0.5], [1, 0, 1, 1, 1], 0.8, (0.5, 0.8, 1.0)),
    ],
)
def test_threshold_for(
    p: list[float], good: list[int], precision: float, expected: tuple[float | None, float, float]
) -> None:
    threshold, reached, recall = op.threshold_for(
        np.asarray(p), np.asarray(good, dtype=bool), precision
    )
    assert threshold == expected[0]
    assert reached == pytest.approx(expected[1]) and recall == pytest.approx(expected[2])


def test_p_keep_falls_as_the_floor_rises_and_rises_with_the_estimate() -> None:
    scores = np.random.default_rng(1).normal(0, 1, 500)
    table = op.cdf_quantiles(scores)
    floors = np.linspace(0.5, 1.0, 11)
    p = [float(op.p_keep([0.8], [0.05], f, table, 0.01)[0]) for f in floors]
    assert p == sorted(p, reverse=True) and p[0] > 0.99 and p[-1] < 0.01
    means = np.linspace(0.6, 1.0, 9)
    assert list(op.p_keep(means, np.full(9, 0.05), 0.85, table, 0.01)) == sorted(
        op.p_keep(means, np.full(9, 0.05), 0.85, table, 0.01)
    )


def test_p_keep_reads_the_scores_distribution() -> None:
    # scores (m - y) / (s + eps) of 0.0 .. 0.99: the truth falls under the mean by up to
    # one unit; at a floor half a unit under the mean, half the scores keep it
    scores = np.arange(100) / 100
    table = op.cdf_quantiles(scores)
    assert op.p_keep([0.9], [0.0], 0.85, table, 0.1)[0] == pytest.approx(0.5, abs=0.02)


GATE = {
    "floors": [0.8, 0.85, 0.9],
    "precisions": [0.9, 0.95, 0.99],
    "threshold": [[0.5, 0.6, 0.8], [0.55, 0.7, None], [0.6, 0.75, 0.9]],
    "heldout_precision": [[0.92, 0.96, 0.99], [0.91, 0.93, 0.97], [0.9, 0.96, 0.99]],
}


@pytest.mark.parametrize(
    ("floor", "precision", "expected"),
    [
        (0.8, 0.95, 0.6),  # held-out 0.96 reaches 0.95
        (0.85, 0.95, None),  # 0.93 does not; 0.97 does, and that column admits nothing
        (0.9, 0.9, 0.6),
        (0.875, 0.9, 0.6),  # between 0.85 (0.55) and 0.9 (0.6): the more demanding
        (0.7, 0.9, 0.5),  # under the stored floors: the lowest
        (0.99, 0.95, 0.75),  # over them: the highest
        (0.8, 0.93, 0.6),  # a precision between columns: the next one up
    ],
)
def test_threshold_at(floor: float, precision: float, expected: float | None) -> None:
    assert op.threshold_at(GATE, floor, precision) == expected


def test_a_precision_no_column_kept_takes_the_closest() -> None:
    gate = {**GATE, "heldout_precision": [[0.9, 0.92, 0.91]] * 3}
    assert op.column_for(gate, 0, 0.95) == 1


def test_operating_points_are_chosen_without_each_family() -> None:
    rng = np.random.default_rng(3)
    truth = rng.uniform(0.5, 1.0, 600)
    p = np.clip(truth + rng.normal(0, 0.05, 600), 0, 1)
    groups = [f"f{i % 12}" for i in range(600)]
    points = op.operating_points(truth, dict.fromkeys(op.FLOORS, p), groups)
    row = op.FLOORS.index(0.85)
    column = op.PRECISIONS.index(0.95)
    assert points["cv_precision"][row][column] >= 0.95
    assert 0.85 < points["heldout_precision"][row][column] <= 1.0
    thresholds = [t for t in points["threshold"][row] if t is not None]
    assert thresholds == sorted(thresholds), "more precision, a higher threshold"
