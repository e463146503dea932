"""The supervisor keeps its pipe and log directories closed to other users, with the fake
control binary and, where installed, the real nvidia-cuda-mps-control."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.core.mpsstate import MpsDaemonState
from tests.helpers import short_dir
from tests.integration.mps.harness import (
    BINARIES,
    REAL_BINARY,
    front_end,
    make_supervisor,
    wait_for,
)


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("binary", BINARIES)
async def test_pipes_belong_to_the_owner_and_group_and_a_change_is_counted(
    root: Path, binary: str
) -> None:
    supervisor, events, _gpu = make_supervisor(binary, root, client_gid=os.getegid())
    await supervisor.start()
    task = asyncio.create_task(supervisor.run())
    try:
        pipe, logs = supervisor.paths.pipe_dir, supervisor.paths.log_dir
        assert mode(pipe) == 0o750 and mode(logs) == 0o750
        assert os.stat(pipe).st_gid == os.getegid()
        names = os.listdir(pipe)
        assert "control" in names
        if "control_privileged" in names:  # the real daemon's, made under umask 077
            assert mode(Path(pipe) / "control_privileged") & 0o077 == 0
        assert supervisor.up
        os.chmod(pipe, 0o777)  # what an intruder with the owner's rights would do
        await wait_for(lambda: "mps.pipe_permissions" in events.kinds(), 3.0)
        assert mode(pipe) == 0o750
        state = supervisor.state()
        assert isinstance(state, MpsDaemonState)
        assert state.pipe_permission_violations_total >= 1
        assert supervisor.up
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await supervisor.stop()


@pytest.mark.mps_binary
@pytest.mark.skipif(REAL_BINARY is None, reason="nvidia-cuda-mps-control not installed")
async def test_a_privileged_socket_opened_up_is_closed_at_the_next_probe(root: Path) -> None:
    assert REAL_BINARY
    supervisor, events, _gpu = make_supervisor(REAL_BINARY, root)
    await supervisor.start()
    task = asyncio.create_task(supervisor.run())
    try:
        privileged = Path(supervisor.paths.pipe_dir) / "control_privileged"
        assert mode(supervisor.paths.pipe_dir) == 0o700  # no group configured
        os.chmod(privileged, 0o777)
        await wait_for(lambda: mode(privileged) & 0o077 == 0, 3.0)
        assert "mps.pipe_permissions" in events.kinds()
        # the daemon answers on as before (a probe in flight may hold it for a moment)
        await wait_for(
            lambda: (
                front_end(REAL_BINARY, supervisor, "get_default_active_thread_percentage").strip()
                == "40.0"
            ),
            3.0,
        )
        assert supervisor.up
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await supervisor.stop()
