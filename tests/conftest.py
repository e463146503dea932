"""Shared test set-up: markers that skip with a reason, unit-test timeouts, a check that no
asyncio task outlives the test that started it, and one that no process the suite
started (an agent, an MPS daemon, a fake server) outlives the session; ``root``, a short
temporary directory (Unix socket paths are limited to 107 bytes) for the agents, sockets
and stores of a test."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from functools import cache
from pathlib import Path

import pytest

from tests import leftovers
from tests.helpers import short_dir

BEFORE = pytest.StashKey[set[tuple[int, float]]]()
leftovers.mark_session()

UNIT_TIMEOUT_S = 5
# Agents the tests start stop their MPS daemons with them (the production default keeps
# them for the next agent); the tests of that default set runtime.on_stop themselves.
os.environ.setdefault("GPUSHARE_RUNTIME_ON_STOP", "quit")


@cache
def nvml_unavailable_reason() -> str | None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"needs an NVIDIA GPU and driver (NVML: {exc})"
    pynvml.nvmlShutdown()
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[BEFORE] = leftovers.snapshot()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when it leaves processes behind (named, then ended)."""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    left = leftovers.left_behind(session.config.stash.get(BEFORE, set()))
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("processes left behind by the tests:", red=True)
            for line in left:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if "unit" in path.parts and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))
        if item.get_closest_marker("gpu") and (reason := nvml_unavailable_reason()):
            item.add_marker(pytest.mark.skip(reason=reason))
        if item.get_closest_marker("mps_binary") and not shutil.which("nvidia-cuda-mps-control"):
            item.add_marker(
                pytest.mark.skip(
                    reason="needs nvidia-cuda-mps-control (Debian non-free package nvidia-cuda-mps)"
                )
            )
        function = getattr(item, "function", None)
        if function is not None and asyncio.iscoroutinefunction(function):
            item.fixturenames.insert(0, "no_leftover_tasks")  # type: ignore[attr-defined]


@pytest.fixture
async def no_leftover_tasks() -> AsyncIterator[None]:
    """Fail an async test that leaves tasks running behind it."""
    yield
    current = asyncio.current_task()
    running = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if running:  # a closed channel's own tasks end a few loop turns later
        await asyncio.wait(running, timeout=1.0)
    leftovers = [t for t in running if not t.done()]
    for task in leftovers:
        task.cancel()
    assert not leftovers, f"tasks left running: {[t.get_name() for t in leftovers]}"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path
