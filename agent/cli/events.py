"""``gpushare events``: the node's numbered events, filtered by lease, device, kind and
time, as a table or one JSON object a line, followed live with ``--follow``."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import click

from agent.api.proto import agent_pb2 as pb
from agent.cli import exits
from agent.cli.client import AgentUnreachable, get_node, watch_events
from agent.cli.common import agent_where, guarded
from agent.cli.devices import DeviceNameError, resolve_device
from agent.cli.render import message_dict

DEVICE_SHOWN = 12  # characters of a device UUID in the events table
KIND_WIDTH = 24
_AGO = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True, slots=True)
class Since:
    """Where the events start: after a sequence number, or at a time."""

    seq: int = 0
    at: float = 0.0


def parse_since(text: str, now: float) -> Since:
    """``120`` (after sequence 120), ``10m`` / ``2h`` / ``1d`` (that long ago), or an ISO
    time (``2026-12-05T02:00``, local unless it names its zone)."""
    if not text:
        return Since()
    if text.isdigit():
        return Since(seq=int(text))
    ago = _AGO.match(text)
    if ago:
        return Since(at=now - float(ago.group(1)) * _UNIT_S[ago.group(2)])
    try:
        return Since(at=datetime.fromisoformat(text).timestamp())
    except ValueError:
        raise click.BadParameter(
            "a sequence number (120), a time ago (10m, 2h, 1d) or an ISO time (2026-12-05T02:00)",
            param_hint="--since",
        ) from None


@dataclass(frozen=True, slots=True)
class EventFilter:
    lease_id: str = ""
    device_uuid: str = ""
    kind: str = ""  # a kind, or a prefix ending with "." (lease., dra.)
    at_or_after: float = 0.0

    def __call__(self, event: pb.Event) -> bool:
        if self.lease_id and event.lease_id != self.lease_id:
            return False
        if self.device_uuid and event.device_uuid != self.device_uuid:
            return False
        if self.kind and not _kind_matches(event.kind, self.kind):
            return False
        return event.at >= self.at_or_after


def _kind_matches(kind: str, wanted: str) -> bool:
    return kind.startswith(wanted) if wanted.endswith(".") else kind == wanted


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they happen.")
@click.option(
    "--since",
    default="",
    metavar="SEQ|AGO|TIME",
    help="Start after sequence SEQ, AGO back (10m, 2h, 1d) or at an ISO TIME.",
)
@click.option("--lease", "lease_id", default="", help="Only events of this lease.")
@click.option("--device", default="", help="Only events of this device (index, UUID, prefix).")
@click.option("--kind", default="", help="Only this kind (lease.refused), or a prefix (dra.).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.pass_context
def events(
    ctx: click.Context,
    follow: bool,
    since: str,
    lease_id: str,
    device: str,
    kind: str,
    as_json: bool,
) -> None:
    """The node's numbered events: leases, refusals, MPS daemons, devices, GPU faults."""
    socket = agent_where(ctx)
    node = guarded(lambda: get_node(socket))
    start = parse_since(since, time.time())
    wanted = EventFilter(lease_id, _device(node.devices, device), kind, start.at)
    last = node.last_event_seq
    if not follow and last <= start.seq:
        if not as_json:
            click.echo(f"no events after sequence {start.seq}" if start.seq else "no events yet")
        return
    printed = _follow(socket, start.seq, last, follow, wanted, as_json)
    if not printed and not as_json and not follow:
        click.echo("no events match")


def _device(devices: Sequence[pb.Device], name: str) -> str:
    if not name:
        return ""
    try:
        return resolve_device(name, devices)
    except DeviceNameError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)


def _follow(
    socket: object,
    since_seq: int,
    last: int,
    follow: bool,
    wanted: Callable[[pb.Event], bool],
    as_json: bool,
) -> int:
    """Print the matching events; how many were printed."""
    seq_width = max(len("SEQ"), len(str(last)) + (2 if follow else 0))
    printed = 0
    try:
        for event in watch_events(socket, since_seq):  # type: ignore[arg-type]
            if wanted(event):
                if not printed and not as_json:
                    click.echo(_event_row(seq_width, "SEQ", "TIME", "KIND", "DEVICE", "MESSAGE"))
                click.echo(_shown(event, seq_width, as_json))
                printed += 1
                sys.stdout.flush()
            if not follow and event.seq >= last:
                break
    except AgentUnreachable as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.UNREACHABLE)
    except KeyboardInterrupt:
        pass
    return printed


def _shown(event: pb.Event, seq_width: int, as_json: bool) -> str:
    if as_json:
        return json.dumps(message_dict(event))
    stamp = time.strftime("%H:%M:%S", time.localtime(event.at))
    device = event.device_uuid[:DEVICE_SHOWN] or "-"
    return _event_row(seq_width, event.seq, stamp, event.kind, device, event.message)


def _event_row(seq_width: int, seq: object, *cells: str) -> str:
    """One line of the events table; columns are fixed so a followed stream stays aligned
    (the sequence column is sized from the newest sequence number at the start)."""
    stamp, kind, device, message = cells
    return (
        f"{str(seq).rjust(seq_width)}  {stamp:<8}  {kind:<{KIND_WIDTH}}  "
        f"{device:<{DEVICE_SHOWN}}  {message}"
    ).rstrip()
