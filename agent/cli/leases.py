"""On-call commands about leases: list, explain, drain and undrain, events, clear-stale."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from agent.api.proto import agent_pb2 as pb
from agent.cli import exits
from agent.cli.client import (
    AgentRefused,
    AgentUnreachable,
    Where,
    call,
    get_node,
    watch_events,
)
from agent.cli.common import resolve_endpoint, resolve_settings
from agent.cli.devices import DeviceNameError, resolve_device
from agent.cli.render import message_dict, table, to_json
from agent.core.errors import UnitError
from agent.core.units import format_bytes, parse_bytes

PRIORITY = {"guaranteed": pb.GUARANTEED, "burstable": pb.BURSTABLE, "best-effort": pb.BEST_EFFORT}


def _socket(ctx: click.Context) -> Where:
    """The Unix socket, or the TCP endpoint given with --target."""
    root = ctx.find_root()
    return resolve_endpoint(root, resolve_settings(root))


def _guard(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except AgentUnreachable as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.UNREACHABLE)
    except AgentRefused as exc:
        click.echo(f"gpushare: the agent refused: {exc}", err=True)
        sys.exit(exits.FAILURE)


def _device_uuid(where: Where, name: str) -> str:
    """The UUID of the device named by index, UUID or prefix; exits 2 listing the valid
    ones."""
    node = _guard(lambda: get_node(where))
    try:
        return resolve_device(name, node.devices)
    except DeviceNameError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)


def _namespace_and_pod(pod: str) -> tuple[str, str]:
    """``"<namespace>/<name>"`` as two cells, as ``kubectl get pods -A`` shows them; ``-``
    for a lease made for no pod."""
    namespace, _, name = pod.rpartition("/")
    return namespace or "-", name or "-"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--all-devices", is_flag=True, help="Also list each device's committed totals.")
@click.pass_context
def leases(ctx: click.Context, as_json: bool, all_devices: bool) -> None:
    """Live leases (reserved, admitted, ready) with their limits and state."""
    node = _guard(lambda: get_node(_socket(ctx)))
    if as_json:
        click.echo(
            to_json(
                {
                    "leases": [message_dict(x) for x in node.leases],
                    "ledger": [message_dict(x) for x in node.ledger],
                }
            )
        )
        return
    rows = [
        [
            x.lease_id,
            x.state,
            *_namespace_and_pod(x.pod),
            x.device_index,
            x.tenant,
            x.trust_domain,
            x.priority,
            format_bytes(x.memory_bytes),
            f"{x.thread_pct:g}%",
            x.gang_id or "-",
            f"{node.retention_estimates[x.lease_id]:.2f}"
            if x.lease_id in node.retention_estimates
            else "-",
        ]
        for x in node.leases
    ]
    click.echo(
        table(
            [
                "LEASE",
                "STATE",
                "NAMESPACE",
                "POD",
                "DEV",
                "TENANT",
                "TRUST",
                "PRIORITY",
                "MEMORY",
                "THREADS",
                "GANG",
                "EST. RETENTION",
            ],
            rows,
        )
        if rows
        else "no live leases"
    )
    if all_devices:
        click.echo()
        click.echo(
            table(
                ["DEVICE", "LEASES", "MEMORY COMMITTED", "THREADS", "CLOSED"],
                [
                    [
                        d.device_uuid,
                        d.leases,
                        format_bytes(d.memory_committed_bytes),
                        f"{d.threads_committed_pct:g}%",
                        d.closed_detail or "-",
                    ]
                    for d in node.ledger
                ],
            )
        )
        click.echo(
            f"stranded: {format_bytes(node.stranded_memory_bytes)}, "
            f"{node.stranded_thread_pct:g}% threads"
        )


@click.command()
@click.option("--memory", required=True, metavar="SIZE", help="Memory limit, e.g. 20GiB.")
@click.option(
    "--threads",
    "thread_pct",
    type=float,
    default=25.0,
    show_default=True,
    help="Active thread percentage (0, 100].",
)
@click.option(
    "--priority", type=click.Choice(list(PRIORITY)), default="burstable", show_default=True
)
@click.option("--tenant", default="cli", show_default=True)
@click.option("--trust-domain", default="cli", show_default=True)
@click.option("--gpu-model", default="", help="Require a device model, e.g. H100.")
@click.option("--profile", default="", help="The workload's profile (for the retention gate).")
@click.option(
    "--floor",
    "retention_floor",
    type=float,
    default=0.0,
    help="Retention floor to protect (0: none, or the profile's).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def explain(
    ctx: click.Context,
    memory: str,
    thread_pct: float,
    priority: str,
    tenant: str,
    trust_domain: str,
    gpu_model: str,
    profile: str,
    retention_floor: float,
    as_json: bool,
) -> None:
    """Dry-run an admission: would it fit, where, and why each device did or did not.

    Exits 0 when the agent would admit it, 5 when it would refuse it."""
    try:
        memory_bytes = parse_bytes(memory)
    except UnitError as exc:
        click.echo(f"gpushare: --memory: {exc}", err=True)
        sys.exit(exits.CONFIG)
    request = pb.AdmitRequest(
        request=pb.Request(
            request_id=f"explain-{time.time_ns()}",
            tenant=tenant,
            trust_domain=trust_domain,
            priority=PRIORITY[priority],
            memory_bytes=memory_bytes,
            thread_pct=thread_pct,
            gpu_model=gpu_model,
            profile=profile,
            retention_floor=retention_floor,
        )
    )
    answer = _guard(lambda: call(_socket(ctx), "Explain", request))
    if as_json:
        click.echo(to_json(message_dict(answer)))
    else:
        _print_explanation(answer.decision)
    if not answer.decision.admitted:
        sys.exit(exits.REFUSED)


def _print_explanation(d: Any) -> None:
    verdict = f"ADMIT on {d.device_uuid}" if d.admitted else f"REFUSE {d.reason}"
    click.echo(f"{verdict}: {d.message}")
    if d.estimator and any(a.predictions for a in d.attempts):
        click.echo(f"retention estimates by {d.estimator}")
    rows = [
        [
            a.device_uuid,
            "yes" if a.fits else "no",
            a.reason or "-",
            a.detail,
            ", ".join(f"{k}={v:.2f}" for k, v in sorted(a.predictions.items())) or "-",
        ]
        for a in d.attempts
    ]
    click.echo(table(["DEVICE", "FITS", "REASON", "DETAIL", "PREDICTED RETENTION"], rows))


def _drain_command(name: str, method: str, doc: str) -> click.Command:
    @click.command(name, help=f"{doc} DEVICE: its index, UUID or a unique UUID prefix.")
    @click.argument("device", required=False, default="")
    @click.option("--reason", default="", help="Why (shown in events and explanations).")
    @click.pass_context
    def command(ctx: click.Context, device: str, reason: str) -> None:
        where = _socket(ctx)
        uuid = _device_uuid(where, device) if device else ""
        request = pb.DrainRequest(device_uuid=uuid, reason=reason or f"{name} by an operator")
        answer = _guard(lambda: call(where, method, request))
        click.echo(f"{name}ed: {', '.join(answer.devices) or 'nothing to do'}")

    return command


drain = _drain_command(
    "drain", "Drain", "Close DEVICE (or every device) to new leases; live leases stay."
)
undrain = _drain_command("undrain", "Undrain", "Open DEVICE (or every device) to new leases.")


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they happen.")
@click.option("--since", "since_seq", type=int, default=0, help="Start after this sequence.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.pass_context
def events(ctx: click.Context, follow: bool, since_seq: int, as_json: bool) -> None:
    """The node's numbered events: leases, MPS daemons, devices, GPU faults."""
    socket = _socket(ctx)
    last = _guard(lambda: get_node(socket)).last_event_seq
    if not follow and last <= since_seq:
        if not as_json:
            click.echo(f"no events after sequence {since_seq}" if since_seq else "no events yet")
        return
    seq_width = max(len("SEQ"), len(str(last)) + (2 if follow else 0))
    if not as_json:
        click.echo(_event_row(seq_width, "SEQ", "TIME", "KIND", "DEVICE", "MESSAGE"))
    try:
        for event in watch_events(socket, since_seq):
            if as_json:
                click.echo(json.dumps(message_dict(event)))
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(event.at))
                device = event.device_uuid[:DEVICE_SHOWN] or "-"
                click.echo(
                    _event_row(seq_width, event.seq, stamp, event.kind, device, event.message)
                )
            sys.stdout.flush()
            if not follow and event.seq >= last:
                return
    except AgentUnreachable as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.UNREACHABLE)
    except KeyboardInterrupt:
        return


DEVICE_SHOWN = 12  # characters of a device UUID in the events table
KIND_WIDTH = 24


def _event_row(seq_width: int, seq: object, *cells: str) -> str:
    """One line of the events table; columns are fixed so a followed stream stays aligned
    (the sequence column is sized from the newest sequence number at the start)."""
    stamp, kind, device, message = cells
    return (
        f"{str(seq).rjust(seq_width)}  {stamp:<8}  {kind:<{KIND_WIDTH}}  "
        f"{device:<{DEVICE_SHOWN}}  {message}"
    ).rstrip()


@click.command("clear-stale")
@click.option("--dry-run", is_flag=True, help="List what would be done; change nothing.")
@click.pass_context
def clear_stale(ctx: click.Context, dry_run: bool) -> None:
    """Run a janitor pass now: terminate MPS clients whose process is gone or a zombie,
    report (or terminate) clients that belong to no lease, release ready leases whose
    processes all exited, fail the leases of a faulted server and shut it down, act on
    memory-limit violations, expire reservations past their TTL. With --dry-run, list the
    same and change nothing."""
    answer = _guard(lambda: call(_socket(ctx), "ClearStale", pb.ClearStaleRequest(dry_run=dry_run)))
    prefix = "would " if dry_run else ""
    for action in answer.actions:
        click.echo(f"{prefix}{action}")
    if not answer.actions:
        click.echo("nothing stale")
