"""The second synthetic generator: families, nvidia-smi counters, its own physics."""

import pytest

from agent.estimator.records import Workload, family_of
from agent.estimator.synthetic import FAMILIES, Hidden, retentions, runs


def test_records_come_in_families_with_nvidia_smi_counters_only() -> None:
    records = runs(200, seed=3)
    assert 400 <= len(records) <= 600
    families = {family_of(r.target) for r in records}
    assert families <= set(FAMILIES) and len(families) >= 8
    for record in records:
        assert set(record.target.counters) == {"gpu_util", "mem_util", "fb_used_bytes"}
        used = sum(w.memory_bytes for w in (record.target, *record.peers))
        assert used <= record.gpu_memory_bytes, "only sets that fit in memory"
        assert record.retention is not None and 0.0 <= record.retention <= 1.0


def member(
    sm: float, dram: float, sensitivity: float = 1.0, threads: float = 100.0
) -> tuple[Workload, Hidden]:
    return Workload("w", threads, 0, {}), Hidden(sm, dram, sensitivity)


@pytest.mark.parametrize(
    ("members", "low", "high"),
    [
        ([member(0.2, 0.1), member(0.2, 0.1)], 0.97, 1.0),  # light pair: nearly free
        ([member(0.9, 0.1), member(0.9, 0.1)], 0.5, 0.75),  # compute-bound pair
        ([member(0.2, 0.8), member(0.2, 0.8)], 0.3, 0.7),  # bandwidth-bound pair
    ],
)
def test_contention_grows_with_demand(
    members: list[tuple[Workload, Hidden]], low: float, high: float
) -> None:
    kept = retentions(members, 0.3)
    assert all(low <= k <= high for k in kept), kept


def test_sensitivity_and_full_memory_cost_retention() -> None:
    calm, touchy = member(0.3, 0.5, 0.5), member(0.3, 0.5, 1.4)
    kept = retentions([calm, touchy], 0.3)
    assert kept[1] < kept[0]
    assert retentions([calm, touchy], 0.98)[0] < kept[0]
