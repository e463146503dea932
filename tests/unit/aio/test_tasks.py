import asyncio

import pytest

from agent.aio.tasks import Supervisor


async def forever() -> None:
    await asyncio.Event().wait()


async def crash_after(delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    raise RuntimeError("boom")


async def test_crashed_core_task_wakes_the_waiter_with_its_reason() -> None:
    supervisor = Supervisor()
    supervisor.spawn("steady", forever())
    supervisor.spawn("sampler", crash_after(0.01))
    reason = await supervisor.wait(asyncio.Event())
    assert reason is not None and "sampler" in reason and "boom" in reason
    assert await supervisor.stop(timeout_s=1) == []


async def test_core_task_that_returns_is_a_failure() -> None:
    supervisor = Supervisor()
    supervisor.spawn("quitter", asyncio.sleep(0))
    reason = await supervisor.wait(asyncio.Event())
    assert reason == "task quitter exited unexpectedly"
    await supervisor.stop(timeout_s=1)


async def test_non_core_crash_does_not_stop_the_daemon() -> None:
    supervisor = Supervisor()
    supervisor.spawn("helper", crash_after(0), core=False)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert await supervisor.wait(stop) is None
    await supervisor.stop(timeout_s=1)


async def test_stop_cancels_everything_and_is_not_a_failure() -> None:
    supervisor = Supervisor()
    for name in ("a", "b", "c"):
        supervisor.spawn(name, forever())
    assert sorted(supervisor.names) == ["a", "b", "c"]
    stop = asyncio.Event()
    stop.set()
    assert await supervisor.wait(stop) is None
    assert await supervisor.stop(timeout_s=1) == []
    assert supervisor.names == []
    assert supervisor.failure is None


async def test_stop_reports_tasks_that_refuse_to_end() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                await release.wait()

    supervisor = Supervisor()
    supervisor.spawn("stubborn", stubborn())
    await asyncio.sleep(0)
    assert await supervisor.stop(timeout_s=0.05) == ["stubborn"]
    release.set()
    await asyncio.sleep(0.01)


async def test_names_are_unique_while_running() -> None:
    supervisor = Supervisor()
    supervisor.spawn("x", forever())
    with pytest.raises(ValueError, match="already running"):
        supervisor.spawn("x", forever())
    await supervisor.stop(timeout_s=1)
