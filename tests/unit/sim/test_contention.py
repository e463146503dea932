import pytest

from agent.sim.contention import Load, device_counters, retentions

BUSY = {"sm_active": 0.7, "dram_active": 0.3}
LIGHT = {"sm_active": 0.2, "dram_active": 0.05}
MEMORY_HEAVY = {"sm_active": 0.3, "dram_active": 0.9}

CASES = [
    # (description, loads, expected retentions)
    ("alone at full threads keeps everything", [Load(BUSY)], [1.0]),
    ("a thread cap below the solo demand costs throughput", [Load(BUSY, thread_pct=35)], [0.5]),
    ("two busy workloads share the SMs", [Load(BUSY), Load(BUSY)], [1 / 1.4, 1 / 1.4]),
    ("light plus busy fit together", [Load(LIGHT), Load(BUSY)], [1.0, 1.0]),
    (
        "memory bandwidth contention binds",
        [Load(MEMORY_HEAVY), Load(MEMORY_HEAVY)],
        [1 / 1.8, 1 / 1.8],
    ),
    (
        "thread caps make room",
        [Load(BUSY, thread_pct=50), Load(BUSY, thread_pct=50)],
        [0.5 / 0.7, 0.5 / 0.7],
    ),
]


@pytest.mark.parametrize(("description", "loads", "expected"), CASES)
def test_retentions(description: str, loads: list[Load], expected: list[float]) -> None:
    assert retentions(loads) == pytest.approx(expected), description


def test_device_counters_are_idle_without_loads_and_capped_with_them() -> None:
    idle = device_counters([])
    assert idle["sm_active"] == 0.0 and idle["gpu_util"] == 0.0 and idle["fb_used_bytes"] == 0
    busy = device_counters([Load(BUSY, memory_bytes=10), Load(BUSY, memory_bytes=5)])
    assert busy["sm_active"] == pytest.approx(1.0)
    assert busy["fb_used_bytes"] == 15
    assert busy["power_w"] > idle["power_w"]
