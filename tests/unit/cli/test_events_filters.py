"""``gpushare events`` filters, and where the CLI says to look when the agent is gone."""

from __future__ import annotations

from datetime import UTC, datetime

import click
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.cli.client import restart_hint
from agent.cli.events import EventFilter, Since, parse_since

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "since"),
    [
        ("", Since()),
        ("120", Since(seq=120)),
        ("10m", Since(at=NOW - 600)),
        ("1.5h", Since(at=NOW - 5400)),
        ("2d", Since(at=NOW - 172800)),
    ],
)
def test_since_takes_a_sequence_a_time_ago_or_a_time(text: str, since: Since) -> None:
    assert parse_since(text, NOW) == since


def test_since_takes_an_iso_time_and_refuses_anything_else() -> None:
    at = datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()
    assert parse_since("2027-01-15T08:00:00+00:00", NOW) == Since(at=at)
    with pytest.raises(click.BadParameter, match="a time ago"):
        parse_since("yesterday", NOW)


def event(kind: str, lease: str = "", device: str = "", at: float = NOW) -> pb.Event:
    return pb.Event(seq=1, at=at, kind=kind, lease_id=lease, device_uuid=device)


@pytest.mark.parametrize(
    ("wanted", "shown"),
    [
        (EventFilter(), True),
        (EventFilter(lease_id="l-1"), True),
        (EventFilter(lease_id="l-2"), False),
        (EventFilter(device_uuid="GPU-a"), True),
        (EventFilter(device_uuid="GPU-b"), False),
        (EventFilter(kind="lease.refused"), True),
        (EventFilter(kind="lease."), True),  # a prefix
        (EventFilter(kind="lease"), False),  # a kind is whole, or a prefix ending with "."
        (EventFilter(kind="dra."), False),
        (EventFilter(at_or_after=NOW + 1), False),
    ],
)
def test_filters(wanted: EventFilter, shown: bool) -> None:
    assert wanted(event("lease.refused", "l-1", "GPU-a")) is shown


def test_the_restart_hint_follows_where_the_cli_runs() -> None:
    host = restart_hint({})
    assert "systemctl start gpushare-agent" in host and "journalctl -u gpushare-agent" in host
    pod = restart_hint({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "GPUSHARE_RUNTIME_NODE_NAME": "n7"})
    assert "kubectl -n gpushare-system logs --previous" in pod
    assert "spec.nodeName=n7" in pod and "systemctl" not in pod
