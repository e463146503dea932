from pathlib import Path

import pytest

from agent.mps.logs import classify, parse_line

SAMPLES = Path(__file__).parents[2] / "data" / "mps" / "real-logs.txt"

CASES = [
    # (line, kind or None, attributes that must be read)
    (
        "[2024-12-10 06:38:01.120 Control    64] Starting new server 92 for user 1001",
        "mps.server_started",
        {"server_pid": "92", "uid": "1001"},
    ),
    (
        "[2013-08-05 12:50:24.870 Control 13894] NEW SERVER 13929: Ready",
        "mps.server_ready",
        {"server_pid": "13929"},
    ),
    (
        "[2024-12-10 06:38:01.170 Control    64] Server 92 exited with status 1",
        "mps.server_exited",
        {"server_pid": "92", "status": "1"},
    ),
    (
        "[2024-12-10 06:38:01.158 Control    64] Server encountered a fatal exception. Shutting down",  # noqa: E501
        "mps.server_fatal",
        {},
    ),
    ("Legacy Server   425] Failed to start : invalid argument", "mps.server_failed", {}),
    ("[2013-08-06 10:51:31.706 Server 29489] MPS server failed to start", "mps.server_failed", {}),
    (
        "[2026-04-28 18:20:41.699 Control 3511] NEW CLIENT 4267 from user 1000",
        "mps.client_connected",
        {"client_pid": "4267", "uid": "1000"},
    ),
    (
        "[2026-04-28 18:20:41.986 Server 4428] Client {PID: 4267, Context ID: 0} connected",
        "mps.client_connected",
        {"client_pid": "4267"},
    ),
    (
        "[2013-08-05 13:00:09.269 Server 13929] New client 14781 connected",
        "mps.client_connected",
        {"client_pid": "14781"},
    ),
    (
        "[2013-08-05 13:00:09.270 Server 13929] Client 14777 disconnected",
        "mps.client_disconnected",
        {"client_pid": "14777"},
    ),
    (
        "[2026-12-02 12:37:09.775 Control 14566] Invalid percentage, expected between (0.0, 100.0]",
        "mps.command_rejected",
        {},
    ),
    (
        "[2026-12-02 12:37:09.775 Control 14566] No default pinned memory limit set for the device!",  # noqa: E501
        None,
        {},
    ),
    ("[2026-12-02 12:37:09.692 Control 14566] Accepting connection...", None, {}),
    ("[2026-04-28 18:20:41.986 Server 4428] Active Threads Percentage set to 33.0", None, {}),
]


@pytest.mark.parametrize(("raw", "kind", "attrs"), CASES)
def test_classify(raw: str, kind: str | None, attrs: dict[str, str]) -> None:
    event = classify(parse_line(raw))
    if kind is None:
        assert event is None
        return
    assert event is not None and event.kind == kind
    assert attrs.items() <= event.attrs.items()


def test_parse_line_fields() -> None:
    line = parse_line("[2024-12-10 06:38:01.120 Control    64] Accepting connection...")
    assert (line.role, line.pid, line.text) == ("Control", 64, "Accepting connection...")
    stripped = parse_line("Other   425] Startup")
    assert stripped.pid is None and stripped.text == "Other   425] Startup"


def test_every_real_sample_line_parses_without_error() -> None:
    kinds = set()
    for raw in SAMPLES.read_text().splitlines():
        if raw.startswith("#") or not raw.strip():
            continue
        event = classify(parse_line(raw))
        if event:
            kinds.add(event.kind)
    assert {
        "mps.server_started",
        "mps.server_exited",
        "mps.server_fatal",
        "mps.client_connected",
    } <= kinds
