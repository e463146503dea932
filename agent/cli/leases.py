"""On-call commands about leases: list, explain, release, drain and undrain, clear-stale."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from agent.api.proto import agent_pb2 as pb
from agent.cli import exits
from agent.cli.client import (
    Where,
    call,
    get_node,
    report_progress,
)
from agent.cli.common import agent_where, guarded
from agent.cli.devices import DeviceNameError, resolve_device
from agent.cli.render import message_dict, table, to_json
from agent.core.errors import UnitError
from agent.core.units import format_bytes, parse_bytes

PRIORITY = {"guaranteed": pb.GUARANTEED, "burstable": pb.BURSTABLE, "best-effort": pb.BEST_EFFORT}


def _device_uuid(where: Where, name: str) -> str:
    """The UUID of the device named by index, UUID or prefix; exits 2 listing the valid
    ones."""
    node = guarded(lambda: get_node(where))
    try:
        return resolve_device(name, node.devices)
    except DeviceNameError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)


def _uid(lease: pb.Lease) -> str:
    """The UID the lease's processes run as; ``-`` when its caller did not say."""
    return str(lease.run_as_uid) if lease.HasField("run_as_uid") else "-"


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
    node = guarded(lambda: get_node(agent_where(ctx)))
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
            _uid(x),
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
                "UID",
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
    type=click.FloatRange(0.0, 100.0, min_open=True),
    default=25.0,
    show_default=True,
    help="Active thread percentage (0, 100].",
)
@click.option(
    "--priority", type=click.Choice(list(PRIORITY)), default="burstable", show_default=True
)
@click.option("--tenant", default="cli", show_default=True)
@click.option("--trust-domain", default="cli", show_default=True)
@click.option(
    "--run-as-uid",
    type=click.IntRange(0, 4294967294),
    default=None,
    metavar="UID",
    help="The UID the workload would run as (its runAsUser): a device with live leases "
    "of another UID refuses it (USER_CONFLICT). Unset: the one-user rule is not applied.",
)
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
    run_as_uid: int | None,
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
            run_as_uid=run_as_uid,
        )
    )
    answer = guarded(lambda: call(agent_where(ctx), "Explain", request))
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
    @click.command(
        name, help=f"{doc} DEVICE: its index, UUID or a unique UUID prefix; --all: every one."
    )
    @click.argument("device", required=False, default="")
    @click.option("--all", "every", is_flag=True, help="Every device of the node.")
    @click.option("--reason", default="", help="Why (shown in events and explanations).")
    @click.pass_context
    def command(ctx: click.Context, device: str, every: bool, reason: str) -> None:
        if bool(device) == every:
            raise click.UsageError(f"name a DEVICE, or give --all to {name} the whole node")
        where = agent_where(ctx)
        uuid = _device_uuid(where, device) if device else ""
        request = pb.DrainRequest(device_uuid=uuid, reason=reason or f"{name} by an operator")
        answer = guarded(lambda: call(where, method, request))
        click.echo(f"{name}ed: {', '.join(answer.devices) or 'nothing to do'}")

    return command


drain = _drain_command("drain", "Drain", "Close DEVICE to new leases; live leases stay.")
undrain = _drain_command("undrain", "Undrain", "Open DEVICE to new leases.")


@click.command()
@click.argument("lease_id", metavar="LEASE")
@click.pass_context
def release(ctx: click.Context, lease_id: str) -> None:
    """End LEASE now, as its owner's Release does (its clients keep running until they
    exit; the janitor reports them). Releasing a lease released before says so again."""
    answer = guarded(
        lambda: call(agent_where(ctx), "Release", pb.ReleaseRequest(lease_id=lease_id))
    )
    lease = answer.lease
    click.echo(f"lease {lease.lease_id} {lease.state}" + (f" ({lease.pod})" if lease.pod else ""))


@click.command()
@click.argument("lease_id", metavar="LEASE")
@click.argument("units_done", metavar="UNITS", type=float)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def report(ctx: click.Context, lease_id: str, units_done: float, as_json: bool) -> None:
    """Report LEASE's progress: UNITS of work done since its workload started (steps,
    samples, tokens: one unit for the lease's whole life; it never goes down). The agent
    times each report; the rates it measures alone and next to other leases become the run
    records the retention estimator learns from. Prints what it measured so far."""
    answer = guarded(lambda: report_progress(agent_where(ctx), lease_id, units_done))
    if as_json:
        click.echo(to_json(message_dict(answer)))
        return
    rate = f"{answer.rate_per_s:.4g} units/s" if answer.rate_per_s else "no rate yet"
    click.echo(
        f"lease {answer.lease_id}: {units_done:g} units; window {answer.window_s:.1f} s, "
        f"{rate}, {answer.peers} peer(s), {answer.records} run record(s)"
    )


@click.command("clear-stale")
@click.option("--dry-run", is_flag=True, help="List what would be done; change nothing.")
@click.pass_context
def clear_stale(ctx: click.Context, dry_run: bool) -> None:
    """Run a janitor pass now: terminate MPS clients whose process is gone or a zombie,
    report (or terminate) clients that belong to no lease, release ready leases whose
    processes all exited, fail the leases of a faulted server and shut it down, act on
    memory-limit violations, expire reservations past their TTL. With --dry-run, list the
    same and change nothing."""
    answer = guarded(
        lambda: call(agent_where(ctx), "ClearStale", pb.ClearStaleRequest(dry_run=dry_run))
    )
    prefix = "would " if dry_run else ""
    for action in answer.actions:
        click.echo(f"{prefix}{action}")
    if not answer.actions:
        click.echo("nothing stale")
