"""The pipeline on synthetic data: compiled forest equals scikit-learn, CV beats baselines."""

from pathlib import Path

import numpy as np
import pytest

from agent.estimator.compiled import CompiledForest
from agent.estimator.model import RetentionModel
from agent.estimator.training import matrix, save, train
from agent.sim.synth import PROVENANCE, runs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def trained():  # type: ignore[no-untyped-def]
    records = runs(400, seed=1)
    return records, train(records, folds=5, trees=40, seed=0)


def test_grouped_cv_beats_both_baselines(trained) -> None:  # type: ignore[no-untyped-def]
    _records, result = trained
    forest, mean, rule = (result.cv[k] for k in ("forest", "mean", "util_sum_rule"))
    assert forest["mae"] < mean["mae"] and forest["mae"] < rule["mae"]
    assert forest["accuracy_at_0.8"] > max(mean["accuracy_at_0.8"], rule["accuracy_at_0.8"])
    assert 0 <= forest["gate_precision_at_0.8"] <= 1


def test_compiled_forest_equals_sklearn(trained) -> None:  # type: ignore[no-untyped-def]
    records, result = trained
    x = matrix(records, result.names)
    compiled = CompiledForest.from_sklearn(result.forest)
    assert np.abs(compiled.predict(x) - result.forest.predict(x)).max() <= 1e-9
    one = x[:1]
    assert abs(compiled.predict(one)[0] - result.forest.predict(one)[0]) <= 1e-9


def test_saved_model_loads_and_predicts_conservatively(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    records, result = trained
    save(result, tmp_path / "m", data_sha256="x", records=len(records), provenance=PROVENANCE)
    model = RetentionModel.load(tmp_path / "m")
    assert model.metadata["provenance"].startswith("synthetic")
    mean, lower = model.predict(records[:50])
    assert all(low <= m + 1e-12 for m, low in zip(mean, lower, strict=True))
    reference = result.forest.predict(matrix(records[:50], result.names))
    assert np.abs(np.asarray(mean) - reference).max() <= 1e-9
