import json
from pathlib import Path

import pytest

from agent.core.errors import MpsControlError
from agent.core.units import GIB, MIB
from agent.mps import commands as cmd

GOLDEN = json.loads((Path(__file__).parents[2] / "data" / "mps" / "golden.json").read_text())
ANSWERS = {r["command"]: r["stdout"] for r in GOLDEN}  # last answer wins for repeats


def answers_of(command: str) -> list[str]:
    return [r["stdout"] for r in GOLDEN if r["command"] == command]


RENDER_CASES = [
    (cmd.get_server_list(), "get_server_list"),
    (cmd.get_client_list(42), "get_client_list 42"),
    (cmd.set_default_thread_pct(12.345), "set_default_active_thread_percentage 12.3"),
    (cmd.set_thread_pct(42, 50), "set_active_thread_percentage 42 50.0"),
    (cmd.set_default_memory_limit(0, 3 * GIB // 2), "set_default_device_pinned_mem_limit 0 1536M"),
    (cmd.clear_default_memory_limit(3), "set_default_device_pinned_mem_limit 3 0"),
    (cmd.set_memory_limit(42, 0, 512 * MIB + 7), "set_device_pinned_mem_limit 42 0 512M"),
    (cmd.terminate_client(42, 4242), "terminate_client 42 4242"),
    (cmd.shutdown_server(42, force=True), "shutdown_server 42 -f"),
    (cmd.quit_daemon(5), "quit -t 5"),
]


@pytest.mark.parametrize(("command", "text"), RENDER_CASES)
def test_render(command: cmd.Command, text: str) -> None:
    assert command.text == text
    assert command.line() == (text + "\n").encode()


@pytest.mark.parametrize(
    "build",
    [
        lambda: cmd.set_default_thread_pct(0),
        lambda: cmd.set_default_thread_pct(150),
        lambda: cmd.set_default_memory_limit(32, GIB),
        lambda: cmd.set_default_memory_limit(0, MIB - 1),
        lambda: cmd.get_client_list(0),
        lambda: cmd.terminate_client(-1, 5),
        lambda: cmd.quit_daemon(-1),
    ],
)
def test_render_refuses_what_the_daemon_would_misread(build: object) -> None:
    with pytest.raises(MpsControlError):
        build()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("command", "error"),
    [
        ("get_client_list 1234", "Server 1234 not found"),
        ("set_active_thread_percentage 1234 50", "Server 1234 not found"),
        ("terminate_client 1234 5678", "Server 1234 not found"),
        ("ps", "Server not found"),
        ("set_default_client_priority 2", "Invalid priority value - must be 0 or 1!"),
        ("start_server", "A user id (UID) is required to start a new server"),
        ("foo", 'Unknown command "foo"'),
        ("GET_SERVER_LIST", 'Unknown command "GET_SERVER_LIST"'),
        ("get_server_status 1234", 'Unknown command "get_server_status"'),
    ],
)
def test_golden_error_answers_are_errors(command: str, error: str) -> None:
    assert cmd.error_in(ANSWERS[command]) == error
    with pytest.raises(MpsControlError, match="failed"):
        cmd.check(cmd.Command(command), ANSWERS[command])


@pytest.mark.parametrize(
    "command",
    [
        "get_server_list",
        "get_default_active_thread_percentage",
        "set_default_device_pinned_mem_limit 0 2048M",
        "get_default_device_pinned_mem_limit 0",
    ],
)
def test_golden_success_answers_pass(command: str) -> None:
    assert cmd.error_in(ANSWERS[command]) is None


def test_golden_values_parse() -> None:
    assert cmd.parse_pids(ANSWERS["get_server_list"]) == []
    assert cmd.parse_thread_pct(ANSWERS["get_default_active_thread_percentage"]) == 100.0
    assert cmd.parse_thread_pct(ANSWERS["set_default_active_thread_percentage 12.345"]) == 12.3
    limits = [
        cmd.parse_memory_limit(a) for a in answers_of("get_default_device_pinned_mem_limit 0")
    ]
    # unset, 2048M, 512M, 1.5G (misread as 1M), 2T (misread as 2M), -1G (wrapped), 0 (cleared)
    assert limits == [None, 2 * GIB, 512 * MIB, 1 * MIB, 2 * MIB, (2**34 - 1) * GIB, None]


def test_parse_pids_and_bad_values() -> None:
    assert cmd.parse_pids("123\n456\n") == [123, 456]
    with pytest.raises(MpsControlError):
        cmd.parse_pids("123\nServer 5 not found\n")
    with pytest.raises(MpsControlError):
        cmd.parse_thread_pct("")
    with pytest.raises(MpsControlError):
        cmd.parse_memory_limit("1.5G")


PS_TABLE = (
    "PID       ID        SERVER         DEVICE                                      "
    "NAMESPACE      COMMAND        \n"
    "4267      0         4428           GPU-5a7f1b0e-2c3d-4e5f-8a9b-0c1d2e3f4a5b    "
    "4026531836     python train.py --epochs 3\n"
    "4301      1         4428           MIG-1b2c3d4e-5f6a-7b8c-9d0e-1f2a3b4c5d6e    "
    "4026532001     ./serve\n"
)


def test_parse_ps_table_by_whitespace() -> None:
    rows = cmd.parse_ps(PS_TABLE)
    assert [(r.client_pid, r.context_id, r.server_pid) for r in rows] == [
        (4267, 0, 4428),
        (4301, 1, 4428),
    ]
    assert rows[0].command == "python train.py --epochs 3"
    assert rows[1].device.startswith("MIG-") and rows[1].namespace == "4026532001"
    assert cmd.parse_ps(ANSWERS["ps"]) == []


def test_parse_ps_with_priority_column() -> None:
    table = "PID ID SERVER DEVICE NAMESPACE PRIORITY COMMAND\n10 0 20 GPU-x 4026531836 1 a b\n"
    (row,) = cmd.parse_ps(table)
    assert row.priority == 1 and row.command == "a b"
    with pytest.raises(MpsControlError):
        cmd.parse_ps("PID WHAT\n1 2\n")


def test_terminate_client_answers() -> None:
    with pytest.raises(MpsControlError, match="Server 1234 not found"):
        cmd.parse_terminate_reply(ANSWERS["terminate_client 1234 5678"])
    cmd.parse_terminate_reply("0\n")
    cmd.parse_terminate_reply("")
    with pytest.raises(MpsControlError):
        cmd.parse_terminate_reply("1\n")
