"""The supervisor against Debian's real nvidia-cuda-mps-control (535), which runs without a
GPU: it starts, answers and keeps defaults; it only cannot start servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest

from agent.mps.supervisor import DaemonSupervisor
from tests.helpers import short_dir
from tests.integration.mps.harness import REAL_BINARY, front_end, make_supervisor

pytestmark = pytest.mark.mps_binary


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@contextlib.asynccontextmanager
async def supervised(supervisor: DaemonSupervisor) -> AsyncIterator[asyncio.Task[None]]:
    await supervisor.start()
    task = asyncio.create_task(supervisor.run(), name="test-supervisor")
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await supervisor.stop()


async def wait_for(predicate: object, timeout_s: float) -> float:
    started = time.monotonic()
    while not predicate():  # type: ignore[operator]
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not true within {timeout_s} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its (possibly foreign) parent has not reaped."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def read_defaults(supervisor: DaemonSupervisor) -> tuple[str, str]:
    assert REAL_BINARY
    return (
        front_end(REAL_BINARY, supervisor, "get_default_active_thread_percentage").strip(),
        front_end(REAL_BINARY, supervisor, "get_default_device_pinned_mem_limit 0").strip(),
    )


async def test_start_applies_defaults_that_the_real_daemon_reads_back(root: Path) -> None:
    assert REAL_BINARY
    supervisor, events, gpu = make_supervisor(REAL_BINARY, root)
    async with supervised(supervisor):
        assert supervisor.up
        assert read_defaults(supervisor) == ("40.0", "20G")
        assert gpu.exclusive[supervisor.device.uuid] is True
        state = supervisor.state()
        assert state.default_thread_pct == 40.0 and state.default_memory_limit_bytes == 20 * 2**30
        assert "mps.daemon_started" in events.kinds()
    assert gpu.exclusive[supervisor.device.uuid] is False


async def test_kill_9_brings_a_new_daemon_with_the_same_defaults_within_5_s(root: Path) -> None:
    assert REAL_BINARY
    supervisor, events, _gpu = make_supervisor(REAL_BINARY, root)
    async with supervised(supervisor):
        old = supervisor.state().pid
        assert old
        os.kill(old, signal.SIGKILL)
        took_s = await wait_for(
            lambda: supervisor.up and supervisor.state().pid not in (None, old), 5.0
        )
        assert read_defaults(supervisor) == ("40.0", "20G")
        assert supervisor.restarts == 1 and took_s < 5.0
        assert {"mps.daemon_down", "mps.daemon_restarted"} <= set(events.kinds())
    down = [m for kind, m, _a in events.events if kind == "mps.daemon_down"]
    assert down[0] == f"daemon {old} was killed by signal 9 (SIGKILL)"


async def test_stopped_daemon_is_found_hung_and_replaced_while_the_loop_stays_free(
    root: Path,
) -> None:
    assert REAL_BINARY
    supervisor, events, _gpu = make_supervisor(REAL_BINARY, root)
    async with supervised(supervisor):
        hung = supervisor.state().pid
        assert hung
        os.kill(hung, signal.SIGSTOP)
        lags = []

        async def ticker() -> None:
            while True:
                started = time.monotonic()
                await asyncio.sleep(0.05)
                lags.append(time.monotonic() - started - 0.05)

        tick = asyncio.create_task(ticker())
        try:
            await wait_for(lambda: supervisor.up and supervisor.state().pid != hung, 8.0)
        finally:
            tick.cancel()
            await asyncio.gather(tick, return_exceptions=True)
        assert gone(hung)
        assert max(lags) < 0.5, "the event loop was blocked while the daemon hung"
        assert any(
            "hung" in message for kind, message, _a in events.events if kind == "mps.daemon_down"
        )
        assert read_defaults(supervisor) == ("40.0", "20G")


async def test_a_stopped_daemon_stops_answering_at_the_first_failed_probe(root: Path) -> None:
    """Closed to admission (``answering`` false) long before it is declared hung."""
    assert REAL_BINARY
    supervisor, _events, _gpu = make_supervisor(REAL_BINARY, root, hung_after_probes=20)
    async with supervised(supervisor):
        stopped = supervisor.state().pid
        assert stopped and supervisor.state().answering
        os.kill(stopped, signal.SIGSTOP)
        try:
            started = time.monotonic()
            await wait_for(lambda: not supervisor.state().answering, 5.0)
            took_s = time.monotonic() - started
            assert supervisor.up, "not yet replaced: only closed to admission"
            assert took_s < 0.2 + 1.0 + 1.0  # one probe interval, one control timeout, slack
            os.kill(stopped, signal.SIGCONT)
            await wait_for(lambda: supervisor.state().answering, 5.0)
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert supervisor.state().pid == stopped


async def test_stale_files_of_a_killed_daemon_are_cleaned_and_start_succeeds(root: Path) -> None:
    assert REAL_BINARY
    supervisor, events, _gpu = make_supervisor(REAL_BINARY, root)
    pipe = Path(supervisor.paths.pipe_dir)
    pipe.mkdir(parents=True)
    env = {**os.environ, **supervisor.env}
    subprocess.run([REAL_BINARY, "-d"], env=env, check=True)
    await wait_for((pipe / "control").exists, 3.0)
    holder = next(
        p
        for p in psutil.process_iter(["cmdline", "environ"])
        if p.info["cmdline"] == [REAL_BINARY, "-d"]
        and (p.info["environ"] or {}).get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe)
    )
    holder.kill()
    holder.wait(5)
    assert (pipe / "control").exists(), "kill -9 leaves the socket behind"
    async with supervised(supervisor):
        assert supervisor.up
        assert "mps.stale_files_removed" in events.kinds()


async def test_a_live_daemon_is_adopted_not_disturbed(root: Path) -> None:
    assert REAL_BINARY
    supervisor, events, _gpu = make_supervisor(REAL_BINARY, root)
    pipe = Path(supervisor.paths.pipe_dir)
    pipe.mkdir(parents=True)
    Path(supervisor.paths.log_dir).mkdir(parents=True)
    subprocess.run([REAL_BINARY, "-d"], env={**os.environ, **supervisor.env}, check=True)
    await wait_for((pipe / "control").exists, 3.0)
    async with supervised(supervisor):
        assert events.kinds().count("mps.daemon_adopted") == 1
        assert "mps.daemon_started" not in events.kinds(), "adopted, not started"
        assert "mps.stale_files_removed" not in events.kinds()
        assert read_defaults(supervisor) == ("40.0", "20G")
        adopted = supervisor.state().pid
    assert adopted and gone(adopted)


async def test_defaults_changed_behind_the_agents_back_are_restored(root: Path) -> None:
    assert REAL_BINARY
    supervisor, events, _gpu = make_supervisor(REAL_BINARY, root)
    async with supervised(supervisor):
        front_end(REAL_BINARY, supervisor, "set_default_active_thread_percentage 100")
        await wait_for(lambda: supervisor.drift_total >= 1, 3.0)
        await wait_for(lambda: read_defaults(supervisor) == ("40.0", "20G"), 3.0)
        assert "mps.defaults_drift" in events.kinds()


async def test_stop_leaves_no_process_and_no_directory(root: Path) -> None:
    assert REAL_BINARY
    supervisor, events, _gpu = make_supervisor(REAL_BINARY, root)
    async with supervised(supervisor):
        pid = supervisor.state().pid
    assert pid and gone(pid)
    assert not Path(supervisor.paths.base).exists()
    assert any("stopped by quit" in m for k, m, _a in events.events if k == "mps.daemon_stopped")
    await supervisor.stop()  # stopping twice is harmless


async def test_multi_user_mode_is_refused_by_the_535_binary() -> None:
    from agent.core.errors import MpsError
    from agent.mps.manager import check_multi_user
    from agent.mps.version import embedded_release

    assert REAL_BINARY
    release = embedded_release(Path(REAL_BINARY).read_bytes()) or "unknown"
    if release.startswith("535."):
        with pytest.raises(MpsError, match="does not support multi-user mode"):
            await check_multi_user(REAL_BINARY)
    elif release.startswith("580."):
        await check_multi_user(REAL_BINARY)  # seen on an H200 node: its -h lists -M
    else:
        pytest.skip(f"release {release}: which releases have -M is known for 535 and 580 only")
