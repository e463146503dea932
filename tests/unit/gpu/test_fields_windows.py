import pytest

from agent.core.samples import Sample
from agent.core.types import Device
from agent.core.units import GIB, MIB
from agent.gpu.dcgm import load_reader_class, samples_from_dcgm
from agent.gpu.fields import CANONICAL, DCGM_FIELDS, from_dcgm_ids, is_blank
from agent.gpu.windows import WindowAggregator


def test_every_mapped_field_is_canonical() -> None:
    assert {canonical for _id, _name, canonical, _c in DCGM_FIELDS} <= set(CANONICAL)
    assert len({fid for fid, *_ in DCGM_FIELDS}) == len(DCGM_FIELDS)


@pytest.mark.parametrize(
    ("value", "blank"),
    [
        (0.0, False),
        (1e12, False),
        (9223372036854775792, True),
        (9223372036854775794, True),
        (140737488355328.0, True),
        (140737488355330.0, True),
    ],
)
def test_blank_sentinels(value: float, blank: bool) -> None:
    assert is_blank(value) is blank


def test_dcgm_ids_to_canonical() -> None:
    counters = from_dcgm_ids({1002: 0.5, 252: 2048, 155: 300.5, 150: 9223372036854775794, 9: 1})
    assert counters == {"sm_active": 0.5, "fb_used_bytes": 2048.0 * MIB, "power_w": 300.5}


def test_dcgm_gpu_ids_follow_nvml_indices_and_skip_mig() -> None:
    devices = [
        Device("GPU-a", 0, "H100", 80 * GIB),
        Device("GPU-b", 1, "H100", 80 * GIB),
        Device("MIG-c", 1, "H100", 40 * GIB, parent_uuid="GPU-b", gpu_instance_id=1),
    ]
    samples = samples_from_dcgm({1: {1002: 0.25}, 7: {1002: 1.0}}, devices, taken_at=3.0)
    assert [(s.device_uuid, dict(s.counters)) for s in samples] == [("GPU-b", {"sm_active": 0.25})]


def test_missing_dcgm_bindings_say_where_they_were_looked_for() -> None:
    from agent.core.errors import TelemetryError

    with pytest.raises(TelemetryError, match="datacenter-gpu-manager-4"):
        load_reader_class(("/nonexistent/datacenter-gpu-manager-4/bindings/python3",))


def sample(t: float, **counters: float) -> Sample:
    return Sample("GPU-a", t, counters)


def test_windows_are_aligned_and_hold_mean_and_max() -> None:
    agg = WindowAggregator("GPU-a", window_s=10)
    assert agg.add(sample(100.0, gpu_util=10)) is None
    assert agg.add(sample(104.0, gpu_util=30, power_w=200)) is None
    assert agg.add(sample(109.9, gpu_util=20)) is None
    closed = agg.add(sample(110.0, gpu_util=90))
    assert closed is not None
    assert (closed.start_at, closed.window_s, closed.sample_count) == (100.0, 10, 3)
    assert closed.mean == {"gpu_util": 20.0, "power_w": 200.0}
    assert closed.max == {"gpu_util": 30.0, "power_w": 200.0}
    assert agg.latest() == closed


def test_a_gap_skips_empty_windows_and_late_samples_are_dropped() -> None:
    agg = WindowAggregator("GPU-a", window_s=10)
    agg.add(sample(100.0, x=1))
    closed = agg.add(sample(150.0, x=5))  # four silent windows: nothing invented for them
    assert closed is not None and closed.start_at == 100.0
    assert agg.add(sample(120.0, x=99)) is None  # from a window already past
    closed = agg.add(sample(160.0, x=7))
    assert closed is not None and closed.mean == {"x": 5.0}


def test_memory_is_bounded() -> None:
    agg = WindowAggregator("GPU-a", window_s=1, keep=5)
    for t in range(100):
        agg.add(sample(float(t), x=float(t)))
    history = agg.history()
    assert len(history) == 5 and history[-1].start_at == 98.0


def test_a_window_closes_when_its_time_is_over_without_waiting_for_a_sample() -> None:
    windows = WindowAggregator("GPU-0", window_s=10)
    assert windows.add(Sample("GPU-0", 101.0, {"sm_active": 0.5})) is None
    assert windows.close_if_due(109.9) is None, "still open"
    closed = windows.close_if_due(110.0)
    assert closed is not None and closed.start_at == 100.0 and closed.mean == {"sm_active": 0.5}
    assert windows.close_if_due(130.0) is None, "nothing open, nothing to close"
    assert windows.add(Sample("GPU-0", 131.0, {"sm_active": 0.1})) is None
