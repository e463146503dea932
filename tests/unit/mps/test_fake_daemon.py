"""The fake daemon answers every recorded command exactly as the real 535 binary did."""

import itertools
import json
from pathlib import Path

import pytest

from agent.mps.fake_daemon import FakeMpsState

GOLDEN = json.loads((Path(__file__).parents[2] / "data" / "mps" / "golden.json").read_text())


class World:
    """Fake daemon state with counters for server PIDs and captured logs."""

    def __init__(self, *, multi_user: bool = False) -> None:
        self.pids = itertools.count(5000)
        self.stopped: list[int] = []
        self.control: list[str] = []
        self.server: list[str] = []
        self.memory: list[dict[int, int]] = []  # each publication of the clients' memory
        self.state = FakeMpsState(
            daemon_pid=100,
            start_server=lambda: next(self.pids),
            stop_server=self.stopped.append,
            control_log=self.control.append,
            server_log=self.server.append,
            multi_user=multi_user,
            client_memory=self.memory.append,
        )

    def say(self, line: str) -> str:
        return self.state.handle(line).text


def test_same_answers_as_the_real_binary_in_the_same_order() -> None:
    world = World()
    mismatches = [
        (r["command"], r["stdout"], answer)
        for r in GOLDEN
        if r["rc"] == 0 and (answer := world.say(r["command"])) != r["stdout"]
    ]
    assert not mismatches


def test_log_only_errors_go_to_the_control_log() -> None:
    world = World()
    world.say("set_default_active_thread_percentage 0")
    world.say("set_default_device_pinned_mem_limit 40 1G")
    assert any("Invalid percentage" in line for line in world.control)
    assert any("Invalid device ordinal!" in line for line in world.control)


def test_servers_per_uid_clients_limits_and_terminate() -> None:
    world = World(multi_user=True)  # two UIDs at once: multi-user mode only
    world.say("set_default_active_thread_percentage 40")
    world.say("set_default_device_pinned_mem_limit 0 8192M")
    server = int(world.say("fake_connect_client 700 1000"))
    assert int(world.say("fake_connect_client 701 1000")) == server, "same UID, same server"
    other = int(world.say("fake_connect_client 800 2000"))
    assert other != server
    assert world.say("get_server_list") == f"{server}\n{other}\n"
    assert world.say(f"get_client_list {server}") == "700\n701\n"
    assert world.say(f"get_active_thread_percentage {server}") == "40.0\n"
    assert world.say(f"get_device_pinned_mem_limit {server} 0") == "8G\n"
    assert world.say(f"set_active_thread_percentage {server} 25") == "25.0\n"
    assert world.say(f"terminate_client {server} 700") == "0\n"
    assert world.say(f"get_client_list {server}") == "701\n"
    assert world.say(f"terminate_client {server} 999").endswith("1\n")
    table = world.say("ps").splitlines()
    assert table[0].split() == ["PID", "ID", "SERVER", "DEVICE", "NAMESPACE", "COMMAND"]
    assert len(table) == 3


def test_fatal_fault_refuses_new_clients_until_the_old_ones_are_gone() -> None:
    world = World()
    server = int(world.say("fake_connect_client 700 0"))
    world.say("fake_connect_client 701 0")
    world.say(f"fake_fault {server}")
    assert any("fatal exception" in line for line in world.control)
    assert world.say("fake_connect_client 702 0").startswith("refused")
    world.say(f"terminate_client {server} 700")
    assert server in world.state.servers
    world.say(f"terminate_client {server} 701")
    assert server not in world.state.servers and world.stopped == [server]
    assert any(f"Server {server} exited with status 1" in line for line in world.control)
    assert int(world.say("fake_connect_client 702 0")) != server, "a fresh server takes over"


@pytest.mark.parametrize("line", ["quit", "quit -t 5"])
def test_quit_and_hang_flags(line: str) -> None:
    world = World()
    assert world.state.handle(line).quit
    assert world.state.handle("fake_hang").hang
