"""The client example runs as a user would run it, finding the agent as the CLI does."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from agent.client.local import agent_socket, find_socket, node_settings
from tests.e2e.test_cli_session import wait_for_socket
from tests.helpers import REPO, short_dir, spawn_agent, subprocess_env


def test_the_example_admits_prints_the_environment_and_releases() -> None:
    with short_dir() as root:
        agent = spawn_agent(root, "--set", "runtime.on_stop=quit")
        try:
            wait_for_socket(root, agent)
            env = {**subprocess_env(), "GPUSHARE_SOCKET": str(root / "agent.sock")}
            done = subprocess.run(
                [sys.executable, str(REPO / "examples" / "admit.py"), "4GiB", "10"],
                env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10" in done.stdout
            assert "released l-" in done.stdout
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=20)


def test_the_socket_is_found_as_the_cli_finds_it(tmp_path: Path) -> None:
    env = {"GPUSHARE_PATHS_RUNTIME_DIR": str(tmp_path / "run")}
    settings = node_settings(env=env)
    assert find_socket(env) == agent_socket(settings) == f"{tmp_path}/run/agent.sock"
    assert find_socket({**env, "GPUSHARE_SOCKET": "/x.sock"}) == "/x.sock"
    config = tmp_path / "c.yaml"
    config.write_text("version: 1\napi:\n  unix_socket: /srv/agent.sock\n")
    assert find_socket({"GPUSHARE_CONFIG": str(config)}) == "/srv/agent.sock"
