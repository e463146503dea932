from agent.core.errors import TelemetryError
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.gpu.sampler import Sampler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_failing_source_goes_stale_and_recovers() -> None:
    clock = Clock()
    devices = await FakeGpuBackend.with_gpus(2).list_devices()
    source = FakeTelemetrySource(clock=clock)
    sampler = Sampler(source, devices, interval_s=1.0, clock=clock)

    assert sampler.stale_devices(stale_after_s=5) == [d.uuid for d in devices]
    await sampler.sample_once()
    assert sampler.stale_devices(stale_after_s=5) == []
    assert len(sampler.latest()) == 2 and sampler.samples_total == 2

    source.fail_with = TelemetryError("exporter answered 500")
    for _ in range(3):
        clock.now += 2
        await sampler.sample_once()
    assert sampler.errors_total == 3
    assert sampler.last_error == "exporter answered 500"
    assert sampler.stale_devices(stale_after_s=5) == [d.uuid for d in devices]

    source.fail_with = None
    await sampler.sample_once()
    assert sampler.stale_devices(stale_after_s=5) == []
    assert sampler.last_error == ""


async def test_a_bug_in_the_source_is_not_swallowed() -> None:
    devices = await FakeGpuBackend.with_gpus(1).list_devices()
    source = FakeTelemetrySource()
    source.fail_with = ZeroDivisionError("bug")
    sampler = Sampler(source, devices, interval_s=1.0)
    try:
        await sampler.sample_once()
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("a bug must propagate to the supervisor")
