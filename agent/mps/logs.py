"""Read MPS control and server log lines and turn the ones that matter into events.

Pure. Line format (535 and later): ``[YYYY-MM-DD HH:MM:SS.mmm <Role> <pid>] <text>`` with
Role one of Control, Server, Client, Other, Legacy Server. Lines whose prefix was stripped
are read as text with an unknown role.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_LINE_RE = re.compile(
    r"^\[(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\s+"
    r"(?P<role>Control|Server|Client|Other|Legacy Server)\s+(?P<pid>\d+)\]\s?(?P<text>.*)$"
)


@dataclass(frozen=True, slots=True)
class LogLine:
    text: str
    role: str = ""
    pid: int | None = None
    at: str = ""


@dataclass(frozen=True, slots=True)
class LogEvent:
    """An event read from a log line: ``kind`` plus the numbers the line carried."""

    kind: str
    message: str
    attrs: dict[str, str] = field(default_factory=dict)


def parse_line(raw: str) -> LogLine:
    match = _LINE_RE.match(raw.strip())
    if match is None:
        return LogLine(text=raw.strip())
    return LogLine(
        text=match.group("text").strip(),
        role=match.group("role"),
        pid=int(match.group("pid")),
        at=match.group("at"),
    )


# (event kind, pattern); named groups become the event's attributes.
# "No default pinned memory limit set for the device!" is not here: it is the daemon's
# routine log line when a getter finds no limit, which the health probe does every time.
_REJECTED = r"^(?P<error>Invalid percentage.*|Invalid device ordinal!)"
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("mps.server_started", r"^Starting new server (?P<server_pid>\d+) for user (?P<uid>\d+)"),
        ("mps.server_ready", r"^NEW SERVER (?P<server_pid>\d+): Ready"),
        ("mps.server_exited", r"^Server (?P<server_pid>\d+) exited with status (?P<status>-?\d+)"),
        ("mps.server_fatal", r"^Server encountered a fatal exception"),
        ("mps.server_failed", r"(Failed to start : .*|MPS server failed to start)"),
        ("mps.client_connected", r"^NEW CLIENT (?P<client_pid>\d+) from user (?P<uid>\d+)"),
        ("mps.client_connected", r"^New client (?P<client_pid>\d+) connected"),
        (
            "mps.client_connected",
            r"^Client \{PID: (?P<client_pid>\d+), Context ID: \d+\} connected",
        ),
        ("mps.client_disconnected", r"^Client (?P<client_pid>\d+) disconnected"),
        (
            "mps.client_disconnected",
            r"^Client \{PID: (?P<client_pid>\d+), Context ID: \d+\} disconnected",
        ),
        ("mps.command_rejected", _REJECTED),
    )
)


def classify(line: LogLine) -> LogEvent | None:
    """The event a log line stands for, or None for routine lines."""
    for kind, pattern in _RULES:
        match = pattern.search(line.text)
        if match is not None:
            attrs = {k: v for k, v in match.groupdict().items() if v is not None}
            if line.pid is not None:
                attrs.setdefault("log_pid", str(line.pid))
            return LogEvent(kind=kind, message=line.text, attrs=attrs)
    return None
