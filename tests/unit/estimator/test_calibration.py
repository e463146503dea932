"""The calibrated lower estimate: conformal quantiles, bands, and coverage by group."""

import math

import numpy as np
import pytest

from agent.estimator import calibration as cal


@pytest.mark.parametrize(
    ("scores", "level", "expected"),
    [
        ([3.0, 1.0, 2.0], 0.5, 2.0),  # ceil(4 * 0.5) = 2nd smallest
        ([3.0, 1.0, 2.0], 0.75, 3.0),  # ceil(4 * 0.75) = 3rd
        ([3.0, 1.0, 2.0], 0.99, 3.0),  # past n: the largest
        (list(range(1, 100)), 0.9, 90.0),  # ceil(100 * 0.9) = 90th
        ([], 0.9, 0.0),
    ],
)
def test_conformal_quantile_is_the_finite_sample_order_statistic(
    scores: list[float], level: float, expected: float
) -> None:
    assert cal.quantiles(scores, [level]) == [expected]


@pytest.mark.parametrize(
    ("mean", "band"),
    [(0.1, 0), (0.59, 0), (0.6, 1), (0.79, 1), (0.8, 2), (0.899, 2), (0.9, 3), (1.2, 3)],
)
def test_bands_of_the_predicted_mean(mean: float, band: int) -> None:
    assert cal.band_of([mean]).tolist() == [band]


def test_lower_uses_the_band_of_each_mean_and_the_spread() -> None:
    q = [1.0, 2.0, 3.0, 4.0]
    got = cal.lower([0.5, 0.95], [0.1, 0.0], q, eps=0.01)
    np.testing.assert_allclose(got, [0.5 - 1.0 * 0.11, 0.95 - 4.0 * 0.01])


def test_small_bands_borrow_every_score() -> None:
    scores = np.arange(200, dtype=float)
    bands = np.zeros(200, dtype=int)
    bands[:10] = 3  # only 10 scores in the top band: too few for its own quantile
    rows = cal.band_quantiles(scores, bands, [0.5])
    assert rows[3] == cal.quantiles(scores, [0.5]) == rows[1]
    assert rows[0] == cal.quantiles(scores[10:], [0.5])


def test_q_at_interpolates_between_levels_and_refuses_outside() -> None:
    table = {"levels": [0.5, 0.6], "q": [[0.0, 1.0], [2.0, 4.0]]}
    np.testing.assert_allclose(cal.q_at(table, 0.55), [0.5, 3.0])
    with pytest.raises(ValueError, match="coverage"):
        cal.q_at(table, 0.7)


def test_eps_is_the_median_spread_with_a_floor() -> None:
    assert cal.eps_of([0.1, 0.2, 0.3]) == pytest.approx(0.2)
    assert cal.eps_of([0.0, 0.0]) == cal.MIN_EPS


@pytest.mark.parametrize("heavy", [False, True])
def test_grouped_coverage_meets_the_nominal_level_on_unseen_groups(heavy: bool) -> None:
    rng = np.random.default_rng(7)
    groups = [f"g{i % 25}" for i in range(3000)]
    offset = {g: rng.normal(0, 0.02) for g in set(groups)}  # each group errs its own way
    mean = rng.uniform(0.3, 1.0, 3000)
    spread = rng.uniform(0.01, 0.05, 3000)
    noise = rng.standard_t(3, 3000) if heavy else rng.normal(size=3000)
    truth = mean + np.asarray([offset[g] for g in groups]) + noise * spread
    achieved, bounds = cal.grouped_coverage(truth, mean, spread, groups, cal.eps_of(spread))
    for level in (0.7, 0.8, 0.9, 0.95):
        assert abs(achieved[cal.LEVELS.index(level)] - level) <= 0.03
    assert bounds.shape == (3000, len(cal.LEVELS))
    assert np.all(np.diff(bounds, axis=1) <= 1e-12), "higher coverage, lower bound"


def test_the_stored_table_holds_every_level_for_every_band() -> None:
    scores = np.linspace(-1, 1, 400)
    mean = np.linspace(0.3, 1.0, 400)
    table = cal.table(scores, mean, 0.02, 0.9)
    assert table["levels"] == list(cal.LEVELS) and len(table["q"]) == len(cal.EDGES) + 1
    assert all(len(row) == len(cal.LEVELS) for row in table["q"])
    assert all(row == sorted(row) for row in table["q"])
    assert math.isclose(table["eps"], 0.02) and table["coverage"] == 0.9
