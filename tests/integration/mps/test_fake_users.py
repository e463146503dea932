"""Users through the agent's real adapter and the fake front-end executable: a client of a
second UID waits for the first UID's server, multi-user mode (``-M``) runs both at once, and
the simulated NVML lists each client process with what it holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.core.types import Device, GpuProcess
from agent.core.units import GIB
from agent.mps.manager import check_multi_user
from agent.mps.options import DaemonDefaults
from agent.mps.supervisor import DaemonSupervisor
from agent.sim.processes import SimGpuBackend
from tests.helpers import short_dir
from tests.integration.mps.harness import FAKE_BINARY, front_end, make_supervisor

PENDING = "Server is not ready, push client to pending list"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def say(supervisor: DaemonSupervisor, command: str) -> str:
    return front_end(FAKE_BINARY, supervisor, command)


def control_log(supervisor: DaemonSupervisor) -> str:
    return (Path(supervisor.paths.log_dir) / "control.log").read_text()


async def test_a_client_of_a_second_uid_waits_for_the_first_uids_server(root: Path) -> None:
    supervisor, _events, _gpu = make_supervisor(FAKE_BINARY, root)
    await supervisor.start()
    try:
        first = int(say(supervisor, "fake_connect_client 4001 1000"))
        assert say(supervisor, "fake_connect_client 4002 2000") == "pending\n"
        assert say(supervisor, "fake_pending") == "4002 2000\n"

        client = supervisor.client
        assert await client.server_pids() == [first]
        assert await client.client_pids(first) == [4001]
        assert [r.client_pid for r in await client.ps()] == [4001]
        assert await supervisor.probe()
        assert [(s.pid, s.client_pids) for s in supervisor.state().servers] == [(first, (4001,))]
        assert f"NEW CLIENT 4002 from user 2000: {PENDING}" in control_log(supervisor)

        say(supervisor, "fake_disconnect_client 4001")
        (second,) = await client.server_pids()
        assert second != first
        assert await client.client_pids(second) == [4002]
        log = control_log(supervisor)
        assert f"Server {first} exited with status 0" in log
        assert f"Starting new server {second} for user 2000" in log
        assert f"NEW SERVER {second}: Ready" in log
    finally:
        await supervisor.stop()


async def test_multi_user_mode_runs_both_uids_at_once(root: Path) -> None:
    await check_multi_user(FAKE_BINARY)  # its -h lists -M: the agent passes it
    supervisor, _events, _gpu = make_supervisor(FAKE_BINARY, root, multi_user=True)
    await supervisor.start()
    try:
        first = int(say(supervisor, "fake_connect_client 4001 1000"))
        second = int(say(supervisor, "fake_connect_client 4002 2000"))
        assert first != second
        assert sorted(await supervisor.client.server_pids()) == sorted([first, second])
        assert say(supervisor, "fake_pending") == ""
    finally:
        await supervisor.stop()


async def test_four_processes_hold_four_times_the_limit_in_the_simulated_nvml(
    root: Path,
) -> None:
    defaults = DaemonDefaults(thread_pct=100.0, memory_limit_bytes=GIB)
    supervisor, _events, _gpu = make_supervisor(FAKE_BINARY, root, defaults=defaults)
    await supervisor.start()
    try:
        clients = [4101, 4102, 4103, 4104]
        for pid in clients:
            say(supervisor, f"fake_connect_client {pid} 1000")
            assert say(supervisor, f"fake_client_memory {pid} 1024") == ""
        assert say(supervisor, "fake_client_memory 4101 1025").startswith("refused")
        assert await supervisor.probe()

        device = Device(supervisor.device.uuid, 0, "H100", 80 * GIB)
        gpu = SimGpuBackend([device])
        gpu.mps_states = lambda: [supervisor.state()]
        listed = await gpu.processes(device)
        assert listed == [GpuProcess(pid, GIB, mps=True) for pid in clients]
        assert sum(p.used_memory_bytes or 0 for p in listed) == 4 * GIB
    finally:
        await supervisor.stop()
