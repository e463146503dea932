"""The janitor by hand: `gpushare clear-stale [--dry-run]` against the real daemon on the
simulated node, its MPS daemons played by the fake control binary (clients need a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import agent_command, short_dir, spawn_agent, subprocess_env
from tests.integration.mps.harness import FAKE_BINARY

DEAD_PID = 2**22 + 4242  # above pid_max on common kernels: no such process


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_command("--socket", str(root / "agent.sock"), *args),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def until(what: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def fake_front_end(pipe_dir: str, command: str) -> str:
    return subprocess.run(
        [FAKE_BINARY],
        input=command + "\n",
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout.strip()


def test_clear_stale_lists_then_terminates_a_dead_client_once(root: Path) -> None:
    agent = spawn_agent(
        root,
        "--set",
        f"mps.control_binary={FAKE_BINARY}",
        "--set",
        "mps.probe_interval_s=0.2",
        "--set",
        "janitor.interval_s=3600",
    )
    try:
        until(lambda: cli(root, "status", "--json").returncode == 0)
        status = json.loads(cli(root, "status", "--json").stdout)
        device = status["devices"][0]["uuid"]
        pipe_dir = f"{root}/mps/{device}/pipe"
        connected: list[str] = []

        def connect() -> bool:  # the daemon may be between probes or restarting under load
            try:
                connected.append(
                    fake_front_end(pipe_dir, f"fake_connect_client {DEAD_PID} {os.getuid()}")
                )
            except subprocess.CalledProcessError:
                return False
            return True

        until(connect)
        server = connected[0]
        wanted = f"would terminate client {DEAD_PID} of server {server} on {device}: process gone"
        until(lambda: wanted in cli(root, "clear-stale", "--dry-run").stdout)
        again = cli(root, "clear-stale", "--dry-run")
        assert wanted in again.stdout, "a dry run changes nothing"
        assert str(DEAD_PID) in fake_front_end(pipe_dir, f"get_client_list {server}")
        done = cli(root, "clear-stale")
        assert done.returncode == 0
        assert wanted.removeprefix("would ") in done.stdout
        assert str(DEAD_PID) not in fake_front_end(pipe_dir, f"get_client_list {server}")
        after = cli(root, "clear-stale", "--dry-run")
        assert str(DEAD_PID) not in after.stdout
        events = cli(root, "events", "--json")
        kinds = [json.loads(line)["kind"] for line in events.stdout.splitlines() if line]
        assert kinds.count("janitor.terminate") == 1
        assert "mps.client_terminated" in kinds
    finally:
        agent.terminate()
        agent.wait(timeout=30)
