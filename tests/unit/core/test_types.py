import pytest

from agent.core.errors import ValidationError
from agent.core.samples import Sample
from agent.core.types import Decision, Device, Event, PriorityClass, ReasonCode


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"uuid": ""}, "uuid"),
        ({"index": -1}, "index"),
        ({"memory_bytes": 0}, "memory_bytes"),
    ],
)
def test_device_rejects_nonsense(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"uuid": "GPU-1", "index": 0, "model": "m", "memory_bytes": 1}
    with pytest.raises(ValidationError) as info:
        Device(**{**base, **kwargs})  # type: ignore[arg-type]
    assert info.value.field == field


def test_decision_invariants() -> None:
    with pytest.raises(ValidationError):
        Decision(admitted=True)
    with pytest.raises(ValidationError):
        Decision(admitted=False)
    refused = Decision(admitted=False, reason=ReasonCode.NO_MEMORY, message="full")
    assert refused.reason is ReasonCode.NO_MEMORY


def test_mappings_are_frozen_copies() -> None:
    counters = {"gpu_util": 1.0}
    sample = Sample("GPU-1", 0.0, counters)
    counters["gpu_util"] = 99.0
    assert sample.counters["gpu_util"] == 1.0
    with pytest.raises(TypeError):
        sample.counters["gpu_util"] = 2.0  # type: ignore[index]
    event = Event(1, 0.0, "k", "m", attrs={"a": "b"})
    with pytest.raises(TypeError):
        event.attrs["a"] = "c"  # type: ignore[index]


def test_priority_ranks() -> None:
    ranks = sorted(PriorityClass, key=lambda p: p.rank)
    assert ranks == [PriorityClass.BEST_EFFORT, PriorityClass.BURSTABLE, PriorityClass.GUARANTEED]
