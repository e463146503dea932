"""MpsControlClient over a scripted channel: retries, read-backs, error answers."""

from collections import deque

import pytest

from agent.core.errors import MpsControlError
from agent.core.units import GIB
from agent.mps.control import MpsControlClient, _answer


class Scripted:
    """A channel that answers from a script and records what it was asked."""

    def __init__(self, *answers: str) -> None:
        self.answers = deque(answers)
        self.sent: list[str] = []

    async def execute(self, command: str) -> str:
        self.sent.append(command)
        return self.answers.popleft()


def client(*answers: str) -> tuple[MpsControlClient, Scripted]:
    channel = Scripted(*answers)
    return MpsControlClient(channel, retry_delay_s=0), channel


async def test_empty_getter_answer_is_retried() -> None:
    c, channel = client("", "", "40.0\n")
    assert await c.ping() == 40.0
    assert channel.sent == ["get_default_active_thread_percentage"] * 3


async def test_getter_that_never_answers_is_an_error() -> None:
    c, _ = client("", "", "", "")
    with pytest.raises(MpsControlError, match="answered nothing 4 times"):
        await c.ping()


async def test_set_is_read_back() -> None:
    c, channel = client("30.0\n", "30.0\n")
    assert await c.set_default_thread_pct(30) == 30.0
    assert channel.sent == [
        "set_default_active_thread_percentage 30.0",
        "get_default_active_thread_percentage",
    ]


async def test_silently_refused_set_is_caught_by_the_read_back() -> None:
    # The daemon prints the unchanged value and logs the error: only the read-back tells.
    c, _ = client("100.0\n", "100.0\n")
    with pytest.raises(MpsControlError, match=r"reads back 100\.0"):
        await c.set_default_thread_pct(30)


async def test_memory_limit_is_rendered_in_mib_and_read_back() -> None:
    c, channel = client("", "1536M\n")
    await c.set_default_memory_limit(0, 3 * GIB // 2)
    assert channel.sent[0] == "set_default_device_pinned_mem_limit 0 1536M"
    c, _ = client("", "1M\n")
    with pytest.raises(MpsControlError, match="reads back"):
        await c.set_default_memory_limit(0, 3 * GIB // 2)


async def test_clearing_the_limit_reads_back_nothing() -> None:
    c, channel = client("", "")
    await c.set_default_memory_limit(0, None)
    assert channel.sent == [
        "set_default_device_pinned_mem_limit 0 0",
        "get_default_device_pinned_mem_limit 0",
    ]


async def test_error_answers_raise() -> None:
    c, _ = client("Server 77 not found\n")
    with pytest.raises(MpsControlError, match="Server 77 not found"):
        await c.client_pids(77)
    c, _ = client("Server 77 not found\nServer 77 not found!\n1\n")
    with pytest.raises(MpsControlError):
        await c.terminate_client(77, 5)


def test_transport_failures_by_exit_status() -> None:
    from agent.core.errors import MpsDaemonDownError

    assert _answer("x", 0, "Server 1 not found\n", "") == "Server 1 not found\n"
    with pytest.raises(MpsDaemonDownError):
        _answer("x", 1, "", "Cannot find MPS control daemon process\n")
    with pytest.raises(MpsControlError, match="Cannot send command"):
        _answer("x", 1, "", "Cannot send command to MPS control daemon process\n")
