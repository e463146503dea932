"""The vectorised leave-one-out features equal the per-record ones, for any set."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.estimator.compiled import _lower_quantile
from agent.estimator.features import feature_names, features, set_features
from agent.estimator.model import DEFAULT_MODEL_DIR, RetentionModel
from agent.estimator.records import Record, Workload

COUNTERS = ("sm_active", "dram_active", "gpu_util")
NAMES = feature_names(list(COUNTERS), [])

workloads = st.lists(
    st.builds(
        Workload,
        workload=st.just("w"),
        thread_pct=st.floats(0, 100),
        memory_bytes=st.integers(0, 80 * 2**30),
        counters=st.dictionaries(st.sampled_from(COUNTERS), st.floats(0, 100), max_size=3),
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.timeout(60)  # 200 sets of up to 12, each rebuilt as 12 records: slow on a busy CPU
@settings(max_examples=200, deadline=None)
@given(workloads, st.sampled_from(["NVIDIA H100 80GB HBM3", "Tesla T4", "unknown"]))
def test_set_features_match_each_leave_one_out_record(members: list[Workload], model: str) -> None:
    memory = 80 * 2**30
    expected = [
        features(Record(model, memory, target, tuple(m for m in members if m is not target)), NAMES)
        for target in members
    ]
    got = set_features(model, memory, members, NAMES)
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-9, atol=1e-9)


def test_a_lone_workload_has_no_peers() -> None:
    lone = Workload("w", 50.0, 2**30, {"sm_active": 0.4})
    row = dict(zip(NAMES, set_features("H100", 80 * 2**30, [lone], NAMES)[0], strict=True))
    assert row["p.count"] == 0
    assert row["p.max.sm_active"] == 0
    assert row["t.sm_active"] == 0.4
    assert row["t.thread_pct"] == 50.0


@pytest.mark.parametrize("trees", [1, 2, 5, 40, 41])
@pytest.mark.parametrize("quantile", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_lower_quantile_is_numpys_linear_quantile(trees: int, quantile: float) -> None:
    values = np.random.default_rng(trees).random((7, trees))
    np.testing.assert_allclose(
        _lower_quantile(values, quantile), np.quantile(values, quantile, axis=1)
    )


def test_predict_set_matches_predict_of_records_and_its_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = RetentionModel.load(DEFAULT_MODEL_DIR)
    monkeypatch.setattr("agent.estimator.model.ROW_CACHE_SIZE", 3)
    members = [
        Workload(f"w{i}", 10.0 * (i + 1), 2**30 * (i + 1), {"sm_active": 0.1 * i}) for i in range(5)
    ]
    memory = 80 * 2**30
    records = [
        Record("H100", memory, target, tuple(m for m in members if m is not target))
        for target in members
    ]
    expected = tuple(pytest.approx(v) for v in model.predict(records))
    assert model.predict_set("H100", memory, members) == expected
    assert len(model._rows) == 3
    assert model.predict_set("H100", memory, members) == expected
