"""The pipeline on synthetic data: monotonic forest, calibrated lower estimate, baselines."""

from pathlib import Path

import numpy as np
import pytest

from agent.core.errors import ValidationError
from agent.estimator import calibration as cal
from agent.estimator.compiled import CompiledForest
from agent.estimator.evaluation import util_sum_rule
from agent.estimator.model import RetentionModel
from agent.estimator.training import matrix, save, train
from agent.sim.synth import PROVENANCE, runs

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def trained():  # type: ignore[no-untyped-def]
    records = runs(500, seed=1)
    return records, train(records, folds=6, trees=30, seed=0)


@pytest.fixture(scope="module")
def model(trained, tmp_path_factory: pytest.TempPathFactory) -> RetentionModel:  # type: ignore[no-untyped-def]
    records, result = trained
    out = tmp_path_factory.mktemp("model")
    save(result, out, data_sha256="x", records=len(records), provenance=PROVENANCE)
    return RetentionModel.load(out)


def test_grouped_cv_beats_both_baselines(trained) -> None:  # type: ignore[no-untyped-def]
    _records, result = trained
    forest, mean, rule = (result.cv[k] for k in ("forest", "mean", "util_sum_rule"))
    assert forest["mae"] < mean["mae"] and forest["mae"] < rule["mae"]
    assert forest["accuracy_at_0.8"] > max(mean["accuracy_at_0.8"], rule["accuracy_at_0.8"])
    assert result.selected == "forest" and result.calibration["levels_beating_rule"]


def test_the_stated_coverage_holds_on_held_out_families(trained) -> None:  # type: ignore[no-untyped-def]
    _records, result = trained
    forest = result.cv["forest"]
    assert forest["coverage_nominal"] == 0.9
    assert abs(forest["coverage_achieved"] - 0.9) <= 0.03
    achieved = result.curve["achieved"]
    for level in (0.7, 0.8, 0.95):
        assert abs(achieved[cal.LEVELS.index(level)] - level) <= 0.05


def test_more_peer_demand_never_raises_the_prediction(trained) -> None:  # type: ignore[no-untyped-def]
    records, result = trained
    x = matrix(records[:200], result.names)
    compiled = CompiledForest.from_sklearn(result.forest)
    for name in ("x.sm_peers", "x.sm_total", "x.dram_total", "p.sum.sm_active"):
        column = result.names.index(name)
        before = compiled.predict(x)
        busier = x.copy()
        busier[:, column] += 0.3
        assert np.all(compiled.predict(busier) <= before + 1e-12), name


def test_compiled_forest_equals_sklearn(trained) -> None:  # type: ignore[no-untyped-def]
    records, result = trained
    x = matrix(records, result.names)
    compiled = CompiledForest.from_sklearn(result.forest)
    assert np.abs(compiled.predict(x) - result.forest.predict(x)).max() <= 1e-9
    one = x[:1]
    assert abs(compiled.predict(one)[0] - result.forest.predict(one)[0]) <= 1e-9
    per_tree = np.stack([t.predict(x.astype(np.float32)) for t in result.forest.estimators_])
    _mean, spread = compiled.predict_with_spread(x)
    assert np.abs(spread - per_tree.std(axis=0)).max() <= 1e-9


def test_saved_model_predicts_the_calibrated_lower_estimate(trained, model) -> None:  # type: ignore[no-untyped-def]
    records, result = trained
    assert model.metadata["provenance"].startswith("synthetic") and model.coverage == 0.9
    mean, lower = model.predict(records[:50])
    x = matrix(records[:50], result.names)
    reference = result.forest.predict(x)
    assert np.abs(np.asarray(mean) - reference).max() <= 1e-9
    per_tree = np.stack([t.predict(x.astype(np.float32)) for t in result.forest.estimators_])
    calibration = model.metadata["calibration"]
    expected = cal.lower(
        reference, per_tree.std(axis=0), cal.q_at(calibration, 0.9), calibration["eps"]
    )
    assert np.abs(np.asarray(lower) - expected).max() <= 1e-9
    assert all(low <= m + 1e-12 for m, low in zip(mean, lower, strict=True))


def test_higher_coverage_means_a_lower_estimate(trained, model) -> None:  # type: ignore[no-untyped-def]
    records, _result = trained
    _mean, loose = model.with_coverage(0.6).predict(records[:100])
    _mean, tight = model.with_coverage(0.98).predict(records[:100])
    assert all(t <= low + 1e-12 for t, low in zip(tight, loose, strict=True))
    assert sum(tight) < sum(loose)
    with pytest.raises(ValidationError, match="coverage"):
        model.with_coverage(0.999)


def test_a_model_whose_forest_lost_answers_with_the_rule(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    records, result = trained
    result.selected = "util_sum_rule"
    try:
        save(result, tmp_path / "m", data_sha256="x", records=1, provenance="p")
    finally:
        result.selected = "forest"
    model = RetentionModel.load(tmp_path / "m")
    mean, lower = model.predict(records[:20])
    assert mean == lower == [util_sum_rule(r) for r in records[:20]]


def test_one_family_cannot_be_cross_validated() -> None:
    records = [
        r for r in runs(50, seed=2) if r.target.workload == runs(50, seed=2)[0].target.workload
    ]
    with pytest.raises(ValidationError, match="two workload families"):
        train(records, trees=5)
