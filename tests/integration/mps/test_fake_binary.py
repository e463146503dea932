"""The same adapter and supervisor against the fake front-end executable, on the server and
client paths the real binary cannot show without a GPU."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.core.errors import MpsControlError
from agent.core.units import GIB
from agent.mps.supervisor import DaemonSupervisor
from tests.helpers import short_dir
from tests.integration.mps.harness import FAKE_BINARY, front_end, make_supervisor

GOLDEN = Path(__file__).parents[2] / "data" / "mps" / "golden.json"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def connect(supervisor: DaemonSupervisor, client_pid: int, uid: int = 0) -> int:
    """What a CUDA process connecting to the daemon would cause; returns its server PID."""
    return int(front_end(FAKE_BINARY, supervisor, f"fake_connect_client {client_pid} {uid}"))


def test_the_fake_executable_answers_like_the_real_binary() -> None:
    recorder = Path(__file__).parents[2] / "data" / "mps" / "record_golden.py"
    with tempfile.TemporaryDirectory() as out:
        copy = Path(out) / "record_golden.py"
        copy.write_text(recorder.read_text())
        subprocess.run(
            [sys.executable, str(copy), FAKE_BINARY], check=True, timeout=120, capture_output=True
        )
        fake = json.loads((Path(out) / "golden.json").read_text())
    real = json.loads(GOLDEN.read_text())
    assert [(r["command"], r["rc"], r["stdout"]) for r in fake] == [
        (r["command"], r["rc"], r["stdout"]) for r in real
    ]


async def test_clients_per_server_limits_and_terminate(root: Path) -> None:
    supervisor, _events, _gpu = make_supervisor(FAKE_BINARY, root)
    await supervisor.start()
    try:
        server = connect(supervisor, 4001)
        assert connect(supervisor, 4002) == server
        assert await supervisor.probe()
        (listed,) = supervisor.state().servers
        assert (listed.pid, listed.client_pids) == (server, (4001, 4002))

        client = supervisor.client
        assert await client.set_server_thread_pct(server, 25) == 25.0
        await client.set_server_memory_limit(server, 0, 6 * GIB)
        rows = await client.ps()
        assert sorted(r.client_pid for r in rows) == [4001, 4002]
        await client.terminate_client(server, 4001)
        assert await client.client_pids(server) == [4002]
        with pytest.raises(MpsControlError, match=f"Server {server} not found"):
            await client.terminate_client(server, 4001)
        assert os.path.exists(f"/proc/{server}"), "fake servers are real processes"
    finally:
        await supervisor.stop()


async def test_fatal_fault_becomes_events_and_the_server_recovers(root: Path) -> None:
    supervisor, events, _gpu = make_supervisor(FAKE_BINARY, root)
    await supervisor.start()
    run = asyncio.create_task(supervisor.run())
    try:
        server = connect(supervisor, 5001)
        front_end(FAKE_BINARY, supervisor, f"fake_fault {server}")
        refused = front_end(FAKE_BINARY, supervisor, "fake_connect_client 5002 0")
        assert refused.startswith("refused")
        await supervisor.client.terminate_client(server, 5001)
        for _ in range(40):
            if "mps.server_exited" in events.kinds():
                break
            await asyncio.sleep(0.05)
        kinds = events.kinds()
        assert {
            "mps.server_started",
            "mps.client_connected",
            "mps.server_fatal",
            "mps.client_disconnected",
            "mps.server_exited",
        } <= set(kinds)
        exited = next(a for k, _m, a in events.events if k == "mps.server_exited")
        assert exited == {"server_pid": str(server), "status": "1", "log_pid": exited["log_pid"]}
        assert connect(supervisor, 5003) != server, "a new server takes new clients"
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await supervisor.stop()


async def test_hung_fake_daemon_is_replaced(root: Path) -> None:
    supervisor, events, _gpu = make_supervisor(FAKE_BINARY, root)
    await supervisor.start()
    run = asyncio.create_task(supervisor.run())
    hang = subprocess.Popen(
        [FAKE_BINARY],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env={**os.environ, **supervisor.env},
    )
    try:
        first = supervisor.state().pid
        assert hang.stdin is not None
        hang.stdin.write(b"fake_hang\n")
        hang.stdin.close()  # the daemon now never answers anyone
        for _ in range(100):
            if supervisor.up and supervisor.state().pid != first:
                break
            await asyncio.sleep(0.05)
        assert supervisor.state().pid != first
        down = [m for k, m, _a in events.events if k == "mps.daemon_down"]
        assert down and "hung" in down[0]
        assert "mps.daemon_restarted" in events.kinds()
    finally:
        hang.kill()
        hang.wait()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await supervisor.stop()


async def test_fake_servers_die_with_their_daemon(root: Path) -> None:
    """A daemon killed with SIGKILL leaves no stand-in server behind (nothing outlives the
    test suite)."""
    supervisor, _events, _gpu = make_supervisor(FAKE_BINARY, root)
    await supervisor.start()
    try:
        server = connect(supervisor, 4101)
        daemon = supervisor.state().pid
        assert daemon is not None and os.path.exists(f"/proc/{server}")
        os.kill(daemon, signal.SIGKILL)
        for _ in range(100):
            if not os.path.exists(f"/proc/{server}") or _zombie(server):
                break
            await asyncio.sleep(0.05)
        assert not os.path.exists(f"/proc/{server}") or _zombie(server)
    finally:
        await supervisor.stop()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
