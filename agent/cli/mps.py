"""``gpushare mps``: the MPS state of the node, through the agent or straight from the daemons."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import click

from agent.cli import exits
from agent.cli.client import AgentUnreachable, get_node
from agent.cli.common import local_socket, resolve_settings
from agent.cli.render import message_dict, table, to_json
from agent.config import Settings
from agent.core.errors import ConfigError, GpushareError, MpsError
from agent.core.units import format_bytes
from agent.mps.control import MpsControlClient, SubprocessMpsControl
from agent.mps.daemon import lock_holder
from agent.mps.limits import DAEMON_DEVICE_ORDINAL, DaemonPaths
from agent.runtime import effective
from agent.runtime.checks import resolve_control_binary

HEADERS = [
    "DEVICE",
    "DAEMON",
    "PID",
    "RESTARTS",
    "THREADS",
    "MEM LIMIT",
    "SERVERS",
    "CLIENTS",
    "DETAIL",
]


@dataclass
class DirectState:
    device_uuid: str
    up: bool
    pid: int | None
    pipe_dir: str
    default_thread_pct: float | None = None
    default_memory_limit_bytes: int | None = None
    servers: list[dict[str, Any]] = field(default_factory=list)
    detail: str = ""


async def read_daemon(binary: str, paths: DaemonPaths, timeout_s: float) -> DirectState:
    holder = lock_holder(paths.pipe_dir)
    state = DirectState(paths.device_uuid, False, holder or None, paths.pipe_dir)
    env = {"CUDA_MPS_PIPE_DIRECTORY": paths.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": paths.log_dir}
    client = MpsControlClient(SubprocessMpsControl(binary, env, timeout_s=timeout_s))
    try:
        state.default_thread_pct = await client.ping()
        state.default_memory_limit_bytes = await client.default_memory_limit(DAEMON_DEVICE_ORDINAL)
        for pid in await client.server_pids():
            state.servers.append({"pid": pid, "client_pids": await client.client_pids(pid)})
        state.up = True
    except MpsError as exc:
        state.detail = str(exc)
    return state


def daemon_dirs(root: str) -> list[str]:
    """Device UUIDs that have a pipe directory under the MPS root."""
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d, "pipe")))


async def read_all(binary: str, root: str, uuids: list[str], timeout_s: float) -> list[DirectState]:
    return list(
        await asyncio.gather(
            *(read_daemon(binary, DaemonPaths(root, uuid), timeout_s) for uuid in uuids)
        )
    )


def _row(d: dict[str, Any]) -> list[object]:
    clients = [c for s in d.get("servers", []) for c in s.get("client_pids", [])]
    limit = d.get("default_memory_limit_bytes") or 0
    pct = d.get("default_thread_pct") or 0.0
    return [
        d["device_uuid"],
        "up" if d["up"] else "DOWN",
        d.get("pid") or "-",
        d.get("restarts", "-"),
        f"{pct:.1f}%" if pct else "-",
        format_bytes(int(limit)) if limit else "-",
        len(d.get("servers", [])),
        ",".join(map(str, clients)) or "-",
        d.get("detail", ""),
    ]


@click.group()
def mps() -> None:
    """MPS control daemons: state, defaults, servers and clients."""


@mps.command("status")
@click.option(
    "--direct",
    is_flag=True,
    help="Ask the control daemons under mps.root_dir yourself instead of the agent "
    "(for when the agent is down).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option(
    "--timeout",
    "timeout_s",
    default=3.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for each answer.",
)
@click.pass_context
def mps_status(ctx: click.Context, direct: bool, as_json: bool, timeout_s: float) -> None:
    """Per device: daemon PID, up or down, restarts, defaults, servers and clients."""
    root = ctx.find_root()
    settings = resolve_settings(root)
    rows = (
        _direct(_last_agent_settings(root, settings), timeout_s)
        if direct
        else _through_agent(local_socket(ctx, settings), timeout_s)
    )
    if as_json:
        click.echo(to_json(rows))
        return
    if not rows:
        click.echo("no MPS daemons")
        return
    click.echo(table(HEADERS, [_row(r) for r in rows]))


def _through_agent(socket_path: str, timeout_s: float) -> list[dict[str, Any]]:
    try:
        node = get_node(socket_path, timeout_s=timeout_s)
    except AgentUnreachable as exc:
        click.echo(f"gpushare: {exc}\n(try: gpushare mps status --direct)", err=True)
        sys.exit(exits.UNREACHABLE)
    return [message_dict(m) for m in node.mps]


def _last_agent_settings(root: click.Context, settings: Settings) -> Settings:
    """With no --config, the paths of the agent last started on the socket (its published
    settings), so --direct finds a simulated or relocated agent's daemons too."""
    record = None if root.obj.get("config") else effective.last(local_socket(root, settings))
    if record is None:
        return settings
    try:
        return effective.settings_of(record)
    except ConfigError:
        return settings


def _direct(settings: Settings, timeout_s: float) -> list[dict[str, Any]]:
    root = settings.mps_root_dir
    if not os.path.isdir(root):
        click.echo(f"gpushare: no MPS directories under {root}", err=True)
        sys.exit(exits.FAILURE)
    try:
        binary = resolve_control_binary(settings, allow_fake=True)
    except GpushareError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.FAILURE)
    states = asyncio.run(read_all(binary, root, daemon_dirs(root), timeout_s))
    return [asdict(s) for s in states]


def _add_host() -> None:
    from agent.cli.mpshost import mps_host

    mps.add_command(mps_host)


_add_host()
