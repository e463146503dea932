"""``gpushare mps host`` keeps the MPS daemons in a process of its own (mps.launch: host):
agents come and go, even with runtime.on_stop quit, and the daemons and their clients stay;
a daemon that dies is started again by the host and adopted by the agent; the host's own
stop quits them; a second host refuses to run.

Real processes and signals; the fake control binary stands in for the driver's."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.mps.daemon import lock_holder
from tests.e2e.test_restart_keeps_daemons import (
    alive,
    clients_of,
    connect_client,
    node_up,
    stopped,
)
from tests.helpers import agent_command, short_dir, spawn_agent, subprocess_env
from tests.integration.mps.harness import FAKE_BINARY

SHARED = ("--set", f"mps.control_binary={FAKE_BINARY}", "--set", "mps.probe_interval_s=0.2")


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def host(root: Path) -> subprocess.Popen[bytes]:
    with open(root / "host.log", "ab") as log:
        return subprocess.Popen(
            agent_command(
                "mps", "host", "--sim", "--set", f"paths.runtime_dir={root}",
                "--set", f"paths.state_dir={root}/state", *SHARED,
            ),
            env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip


def agent(root: Path) -> subprocess.Popen[bytes]:
    # on_stop quit: the agent would stop daemons it started; the host's it leaves alone
    return spawn_agent(root, "--set", "mps.launch=host", "--set", "runtime.on_stop=quit", *SHARED)


def daemons_of(root: Path, within_s: float = 15.0) -> dict[str, int]:
    """Device -> PID of the daemon holding its pipe directory's lock, once all four do."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        pipes = sorted((root / "mps").glob("*/pipe"))
        holders = {p.parent.name: lock_holder(str(p)) for p in pipes}
        if len(holders) == 4 and all(holders.values()):
            return {uuid: pid for uuid, pid in holders.items() if pid}
        time.sleep(0.1)
    raise AssertionError(f"the host did not start four daemons: {(root / 'host.log').read_text()}")


def test_agents_come_and_go_and_the_host_s_daemons_and_clients_stay(root: Path) -> None:
    keeper = host(root)
    client = subprocess.Popen(["sleep", "120"])
    try:
        daemons = daemons_of(root)
        first = agent(root)
        node = node_up(root, first)
        assert {d.device_uuid: d.pid for d in node.mps} == daemons  # adopted
        device, pipe_dir = node.mps[0].device_uuid, node.mps[0].pipe_dir
        connect_client(pipe_dir, client.pid)
        assert clients_of(root, device) == [client.pid]
        assert stopped(first) == 0
        assert all(alive(pid) for pid in daemons.values()), "the agent stopped a host's daemon"

        second = agent(root)
        try:
            node = node_up(root, second)
            assert {d.device_uuid: d.pid for d in node.mps} == daemons
            assert clients_of(root, device) == [client.pid]
            log = (root / "agent.log").read_text()
            assert "mps.daemon_started" not in log and "daemon_adopted" in log

            died = daemons[device]
            subprocess.run(["kill", "-9", str(died)], check=True)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                node = node_up(root, second)
                pid = next(d.pid for d in node.mps if d.device_uuid == device)
                if pid not in (0, died):
                    break
                time.sleep(0.2)
            assert pid not in (0, died), "the host did not start the daemon again"
            assert pid == daemons_of(root)[device]
        finally:
            assert stopped(second) == 0
        assert keeper.poll() is None
        assert stopped(keeper) == 0
        assert not any(alive(p) for p in daemons_of_gone(daemons, device, pid)), "host quit them"
    finally:
        client.kill()
        client.wait()
        if keeper.poll() is None:
            keeper.kill()


def daemons_of_gone(daemons: dict[str, int], device: str, replaced_by: int) -> list[int]:
    return [replaced_by if uuid == device else pid for uuid, pid in daemons.items()]


def test_a_second_host_exits_3_and_touches_nothing(root: Path) -> None:
    keeper = host(root)
    try:
        daemons = daemons_of(root)
        second = host(root)
        assert second.wait(timeout=30) == 3
        assert "another MPS host" in (root / "host.log").read_text()
        assert daemons_of(root) == daemons
    finally:
        assert stopped(keeper) == 0


def test_an_agent_without_a_host_says_what_is_missing(root: Path) -> None:
    process = spawn_agent(
        root, "--set", "mps.launch=host", "--set", "mps.start_timeout_s=1", *SHARED
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if "gpushare mps host" in (root / "agent.log").read_text():
                break
            time.sleep(0.2)
        assert "which must run on this node" in (root / "agent.log").read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
