"""``gpushare``: run the node agent and look into it.

Settings come from a YAML file (``--config``), then ``GPUSHARE_*`` environment variables,
then flags; ``gpushare config show`` prints the result.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime
from typing import Any

import click
import yaml
from click.core import ParameterSource

from agent import __version__
from agent.cli import exits
from agent.cli.client import AgentUnreachable, get_node
from agent.cli.common import (
    CONTEXT,
    fail,
    local_socket,
    resolve_endpoint,
    resolve_settings,
    set_option,
    sim_option,
)
from agent.cli.common import assignments as parse_assignments
from agent.cli.render import isolation_lines, message_dict, table, to_json
from agent.client.local import DEFAULT_CONFIG
from agent.config import Settings, settings_as_dict
from agent.config.loading import env_name, setting_fields, simulation_paths
from agent.core.errors import (
    AlreadyRunningError,
    ConfigError,
    GpushareError,
    SimulationError,
)
from agent.core.units import format_bytes
from agent.runtime import effective

SERVE_UMASK = 0o077


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "--version", "-V", prog_name="gpushare")
@click.option(
    "--config",
    "-c",
    "config",
    envvar="GPUSHARE_CONFIG",
    metavar="FILE",
    help=f"YAML settings file (version: 1). Default: {DEFAULT_CONFIG} if present. "
    "Env: GPUSHARE_CONFIG.",
)
@click.option(
    "--socket",
    "socket",
    envvar="GPUSHARE_SOCKET",
    metavar="PATH",
    help="The agent's Unix socket (overrides api.unix_socket). Env: GPUSHARE_SOCKET.",
)
@click.option(
    "--target",
    envvar="GPUSHARE_TARGET",
    metavar="HOST:PORT",
    help="Ask the agent's TCP listener instead of the socket (status, leases, explain, "
    "events). Env: GPUSHARE_TARGET.",
)
@click.option(
    "--tls-ca", envvar="GPUSHARE_TLS_CA", metavar="FILE", help="CA of the agent's certificate."
)
@click.option(
    "--tls-cert", envvar="GPUSHARE_TLS_CERT", metavar="FILE", help="Client certificate (mTLS)."
)
@click.option(
    "--tls-key", envvar="GPUSHARE_TLS_KEY", metavar="FILE", help="Client private key (mTLS)."
)
@click.option(
    "--tls-server-name",
    envvar="GPUSHARE_TLS_SERVER_NAME",
    metavar="NAME",
    help="Name to check the agent's certificate against, if not the target's host.",
)
@click.option(
    "--token-file",
    envvar="GPUSHARE_TOKEN_FILE",
    metavar="FILE",
    help="File holding the bearer token for --target.",
)
@click.pass_context
def cli(
    ctx: click.Context, /, config: str | None, socket: str | None, **endpoint: str | None
) -> None:
    """gpushare: a node-local GPU sharing agent (CUDA MPS with limits, leases, admission).

    Start it with `gpushare serve` (`--sim` on a machine without GPUs), then ask it
    with `gpushare status`. Exit codes: 0 ok, 1 failure, 2 configuration or usage
    error, 3 another agent already serves the socket, 4 the agent cannot be reached.
    """
    ctx.ensure_object(dict)
    ctx.obj.update(config=config, socket=socket, endpoint=endpoint)


@cli.command(context_settings=CONTEXT)
@sim_option("Run on a simulated node: 4 x H100 80GB, or the devices in NODE.yaml.")
@click.option(
    "--http-listen",
    metavar="HOST:PORT",
    help="Address for /metrics, /healthz, /readyz (api.http_listen; '' disables).",
)
@click.option(
    "--tcp-listen", metavar="HOST:PORT", help="gRPC listener for the scheduler (api.tcp_listen)."
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="runtime.log_level",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), help="runtime.log_format")
@click.option(
    "--on-stop",
    type=click.Choice(["keep", "drain", "quit"]),
    help="At SIGTERM: keep the MPS daemons running for the next agent (the default), drain "
    "the leases first, or quit the daemons (runtime.on_stop).",
)
@set_option("telemetry.window_s=5")
@click.pass_context
def serve(
    ctx: click.Context,
    sim: str | None,
    http_listen: str | None,
    tcp_listen: str | None,
    log_level: str | None,
    log_format: str | None,
    on_stop: str | None,
    assignments: tuple[str, ...],
) -> None:
    """Run the agent in the foreground until SIGTERM or SIGINT.

    Without --sim the agent needs an NVIDIA driver and refuses to start if there is none.
    """
    # Before any file or socket exists: state, logs and locks for the agent's user alone
    # (the socket narrows it to 0660 at bind, the MPS directories set their own modes).
    previous_umask = os.umask(SERVE_UMASK)
    try:
        flags = parse_assignments(assignments, sim)
        named = {
            "api.http_listen": http_listen,
            "api.tcp_listen": tcp_listen,
            "runtime.log_level": log_level,
            "runtime.log_format": log_format,
            "runtime.on_stop": on_stop,
        }
        flags.update({k: v for k, v in named.items() if v is not None})
        settings = simulation_paths(resolve_settings(ctx, flags))
        sys.exit(_run_agent(settings))
    finally:
        os.umask(previous_umask)  # for a caller in the same process (tests)


def _run_agent(settings: Settings) -> int:
    from agent.cli.logs import setup_logging
    from agent.runtime import checks
    from agent.runtime.app import App

    try:
        app = App(settings, tune_memory=True)
        checks.prepare_state_dir(settings.paths.state_dir)
        setup_logging(level=settings.runtime.log_level, fmt=settings.runtime.log_format)
        return asyncio.run(app.run())
    except (ConfigError, SimulationError) as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    except AlreadyRunningError as exc:
        fail(str(exc), exits.ALREADY_RUNNING)
    except GpushareError as exc:
        fail(str(exc), exits.FAILURE)


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option(
    "--timeout",
    "timeout_s",
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for the agent.",
)
@click.pass_context
def status(ctx: click.Context, as_json: bool, timeout_s: float) -> None:
    """Show the node's devices, their MPS daemons, latest counters and isolation."""
    settings = resolve_settings(ctx)
    try:
        node = get_node(resolve_endpoint(ctx, settings), timeout_s=timeout_s)
    except AgentUnreachable as exc:
        fail(str(exc), exits.UNREACHABLE)
    if as_json:
        click.echo(to_json(message_dict(node)))
        return
    click.echo(_status_text(node))


STATE_WORDS = {"DRAINING": "drained", "DEVICE_DEGRADED": "degraded"}  # else "closed"


def _status_text(node: Any) -> str:
    closed = {x.device_uuid: x for x in node.ledger if x.closed}
    mps = {m.device_uuid: m for m in node.mps}
    windows = {w.device_uuid: w for w in node.latest_windows}
    stale = set(node.stale_devices)
    rows = []
    for d in node.devices:
        daemon = mps.get(d.uuid)
        window = windows.get(d.uuid)
        util = window.mean.get("gpu_util") if window is not None else None
        rows.append(
            [
                d.index,
                d.uuid,
                d.model + (f" [{d.mig_profile}]" if d.mig_profile else ""),
                format_bytes(d.memory_bytes),
                d.sharing_mode,
                STATE_WORDS.get(closed[d.uuid].closed, "closed") if d.uuid in closed else "open",
                ("up" if daemon.up else "DOWN") if daemon else "-",
                f"{util:.0f}%" if util is not None else "-",
                "STALE" if d.uuid in stale else "fresh",
            ]
        )
    mode = "simulated node" if node.simulated else "real node"
    header = (
        f"node {node.node_name} ({mode}), agent {node.agent_version}, "
        f"telemetry {node.telemetry_source or '-'}"
        + (f", leases reach pods by {node.injector}" if node.injector else "")
    )
    columns = ["IDX", "UUID", "MODEL", "MEMORY", "MODE", "STATE", "MPS", "GPU UTIL", "COUNTERS"]
    body = table(columns, rows)
    if node.gone_devices:
        body += "\n\ngone from this node (see gpushare events):\n" + "\n".join(_gone_lines(node))
    if not node.devices:
        return f"{header}\n{body}"
    why = [
        f"  {d.index}  {d.uuid}: {closed[d.uuid].closed_detail}"
        for d in node.devices
        if d.uuid in closed
    ]
    if why:
        body += "\n\nclosed to new leases:\n" + "\n".join(why)
    isolation = "\n".join(isolation_lines(node.devices))
    return f"{header}\n{body}\n\nisolated between the leases of a device:\n{isolation}"


def _gone_lines(node: Any) -> list[str]:
    return [
        f"  {g.device_uuid}: found gone {g.when}, {g.leases_failed} lease(s) failed"
        for g in node.gone_devices
    ]


@cli.group(context_settings=CONTEXT)
def config() -> None:
    """Inspect the configuration."""


@config.command("show", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
@click.option(
    "--doc",
    is_flag=True,
    help="List every setting with its environment variable and meaning instead.",
)
@click.option(
    "--resolved",
    is_flag=True,
    help="Show what file < GPUSHARE_* environment < flags resolve to here, even while an "
    "agent runs.",
)
@click.pass_context
def config_show(ctx: click.Context, as_json: bool, doc: bool, resolved: bool) -> None:
    """Print the running agent's effective configuration.

    With no agent on the socket, with --resolved, or with a file named by --config on the
    command line, it prints what that file, the GPUSHARE_* environment and the flags
    resolve to instead, and says so.
    """
    root = ctx.find_root()
    settings = resolve_settings(root)
    resolved = resolved or root.get_parameter_source("config") is ParameterSource.COMMANDLINE
    if doc:
        for key, f in setting_fields().items():
            click.echo(f"{key}  ({env_name(key)})\n    {f.metadata['doc']}")
        return
    socket = local_socket(ctx, settings)
    record = None if resolved else effective.running(socket)
    if record is not None:
        values = record["settings"]
        started = datetime.fromtimestamp(record["started_at"], UTC).isoformat(timespec="seconds")
        note = f"the running agent's configuration (pid {record['pid']}, started {started})"
    else:
        values = settings_as_dict(settings)
        why = "as asked" if resolved else f"no agent is running on {socket}"
        note = f"{why}: what file < environment < flags resolve to here"
    if as_json:
        click.echo(f"gpushare: {note}", err=True)
        click.echo(to_json(values))
    else:
        click.echo(f"# {note}\n" + yaml.safe_dump(values, sort_keys=False).rstrip())


def main() -> None:
    cli(obj={}, prog_name="gpushare")


def _register_subgroups() -> None:
    from agent.cli import leases
    from agent.cli.doctor import doctor
    from agent.cli.dra import dra
    from agent.cli.estimator import estimator
    from agent.cli.events import events
    from agent.cli.gpu import gpu
    from agent.cli.kube import kube
    from agent.cli.mps import mps
    from agent.cli.profile import profile
    from agent.cli.readiness import readiness
    from agent.cli.sizing import size_command
    from agent.cli.telemetry import telemetry

    for command in (
        mps,
        profile,
        telemetry,
        estimator,
        kube,
        dra,
        gpu,
        readiness,
        leases.leases,
        leases.explain,
        size_command,
        leases.release,
        leases.report,
        leases.drain,
        leases.undrain,
        events,
        leases.clear_stale,
        doctor,
    ):
        cli.add_command(command)


_register_subgroups()
