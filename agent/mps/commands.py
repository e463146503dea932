"""Render the MPS control commands the agent uses, and read every answer the front-end gives.

Pure: no I/O. Answers are classified by their text, never by the exit status (the 535
front-end exits 0 for ``Server 1234 not found`` and ``Unknown command "x"`` alike). Formats
are those recorded from the real binary (``tests/data/mps/``); where a format could not be
observed without a GPU (``ps`` rows, a successful ``terminate_client``) the parser follows
the binary's format strings and is lenient about the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.core.errors import MpsControlError, UnitError
from agent.core.units import check_thread_percentage, mps_memory_limit, parse_mps_memory_limit

MAX_DEVICE_ORDINAL = 31  # the 535 daemon rejects 32 and above (in its log only)

# Answers that mean the command failed, although the front-end exits 0.
_ERROR_PATTERNS = (
    re.compile(r"^Server \d+ not found!?$"),
    re.compile(r"^Server not found$"),
    re.compile(r'^Unknown command ".*"$'),
    re.compile(r"^Invalid .*"),
    re.compile(r"^A user id \(UID\) is required.*"),
    re.compile(r"^Insufficient privileges.*"),
    re.compile(r"^Not enough privilege.*"),
)


@dataclass(frozen=True, slots=True)
class Command:
    """One control command. ``getter`` marks commands whose empty answer means 'retry'."""

    text: str
    getter: bool = False

    def line(self) -> bytes:
        return (self.text + "\n").encode()


def _pid(pid: int) -> str:
    if pid <= 0:
        raise MpsControlError(f"not a process id: {pid}")
    return str(pid)


def _device(ordinal: int) -> str:
    if not 0 <= ordinal <= MAX_DEVICE_ORDINAL:
        raise MpsControlError(f"device ordinal {ordinal} is outside 0..{MAX_DEVICE_ORDINAL}")
    return str(ordinal)


def _pct(value: float) -> str:
    try:
        return f"{check_thread_percentage(value):.1f}"
    except UnitError as exc:
        raise MpsControlError(str(exc)) from exc


def _memory(value_bytes: int) -> str:
    try:
        return mps_memory_limit(value_bytes)
    except UnitError as exc:
        raise MpsControlError(str(exc)) from exc


def get_server_list() -> Command:
    return Command("get_server_list")


def get_client_list(server_pid: int) -> Command:
    return Command(f"get_client_list {_pid(server_pid)}")


def get_default_thread_pct() -> Command:
    return Command("get_default_active_thread_percentage", getter=True)


def set_default_thread_pct(pct: float) -> Command:
    return Command(f"set_default_active_thread_percentage {_pct(pct)}")


def get_thread_pct(server_pid: int) -> Command:
    return Command(f"get_active_thread_percentage {_pid(server_pid)}", getter=True)


def set_thread_pct(server_pid: int, pct: float) -> Command:
    return Command(f"set_active_thread_percentage {_pid(server_pid)} {_pct(pct)}")


def get_default_memory_limit(device: int) -> Command:
    # An unset limit answers nothing, so this getter's empty answer is a value, not a retry.
    return Command(f"get_default_device_pinned_mem_limit {_device(device)}")


def set_default_memory_limit(device: int, limit_bytes: int) -> Command:
    return Command(f"set_default_device_pinned_mem_limit {_device(device)} {_memory(limit_bytes)}")


def clear_default_memory_limit(device: int) -> Command:
    return Command(f"set_default_device_pinned_mem_limit {_device(device)} 0")


def get_memory_limit(server_pid: int, device: int) -> Command:
    return Command(f"get_device_pinned_mem_limit {_pid(server_pid)} {_device(device)}")


def set_memory_limit(server_pid: int, device: int, limit_bytes: int) -> Command:
    return Command(
        f"set_device_pinned_mem_limit {_pid(server_pid)} {_device(device)} {_memory(limit_bytes)}"
    )


def terminate_client(server_pid: int, client_pid: int) -> Command:
    return Command(f"terminate_client {_pid(server_pid)} {_pid(client_pid)}")


def shutdown_server(server_pid: int, *, force: bool = False) -> Command:
    return Command(f"shutdown_server {_pid(server_pid)}{' -f' if force else ''}")


def ps() -> Command:
    return Command("ps")


def quit_daemon(timeout_s: int) -> Command:
    if timeout_s < 0:
        raise MpsControlError(f"quit timeout {timeout_s} is negative")
    return Command(f"quit -t {timeout_s}")


# -- answers -------------------------------------------------------------------------------


def lines(answer: str) -> list[str]:
    return [line.strip() for line in answer.splitlines() if line.strip()]


def error_in(answer: str) -> str | None:
    """The first error line of an answer, or None if the answer carries no error."""
    for line in lines(answer):
        if any(p.match(line) for p in _ERROR_PATTERNS):
            return line
    return None


def check(command: Command, answer: str) -> str:
    """Return the answer, or raise :class:`MpsControlError` if it reports an error."""
    error = error_in(answer)
    if error is not None:
        raise MpsControlError(f"{command.text!r} failed: {error}")
    return answer


def parse_pids(answer: str) -> list[int]:
    """A PID per line (``get_server_list``, ``get_client_list``); empty means none."""
    pids = []
    for line in lines(answer):
        if not line.isdigit():
            raise MpsControlError(f"expected a PID per line, got {line!r}")
        pids.append(int(line))
    return pids


def parse_thread_pct(answer: str) -> float:
    """``40.0`` -> 40.0. An empty answer is an error for the caller to retry."""
    text = answer.strip()
    try:
        value = float(text)
    except ValueError:
        raise MpsControlError(f"expected a thread percentage, got {text!r}") from None
    return value


def parse_memory_limit(answer: str) -> int | None:
    """``2G`` / ``512M`` -> bytes; an empty answer means no limit is set."""
    text = answer.strip()
    if not text:
        return None
    try:
        return parse_mps_memory_limit(text)
    except UnitError as exc:
        raise MpsControlError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class PsRow:
    """One client as ``ps`` lists it."""

    client_pid: int
    context_id: int
    server_pid: int
    device: str
    namespace: str
    command: str
    priority: int | None = None


def parse_ps(answer: str) -> list[PsRow]:
    """Parse the ``ps`` table by whitespace (not by column), with or without PRIORITY."""
    rows = lines(answer)
    if not rows or rows[0] == "Server not found":
        return []
    header = rows[0].split()
    if header[:3] != ["PID", "ID", "SERVER"]:
        raise MpsControlError(f"unexpected ps header: {rows[0]!r}")
    with_priority = "PRIORITY" in header
    fields = 6 if with_priority else 5
    return [_ps_row(row, fields, with_priority) for row in rows[1:]]


def _ps_row(row: str, fields: int, with_priority: bool) -> PsRow:
    parts = row.split(maxsplit=fields)
    if len(parts) < fields or not all(p.isdigit() for p in parts[:3]):
        raise MpsControlError(f"unexpected ps row: {row!r}")
    return PsRow(
        client_pid=int(parts[0]),
        context_id=int(parts[1]),
        server_pid=int(parts[2]),
        device=parts[3],
        namespace=parts[4],
        priority=int(parts[5]) if with_priority else None,
        command=parts[fields] if len(parts) > fields else "",
    )


def parse_terminate_reply(answer: str) -> None:
    """``terminate_client`` answers error lines and a trailing status digit (1 = failed)."""
    error = error_in(answer)
    if error is not None:
        raise MpsControlError(f"terminate_client failed: {error}")
    status = lines(answer)[-1:] or ["0"]
    if status[0] != "0":
        raise MpsControlError(f"terminate_client answered {answer.strip()!r}")
