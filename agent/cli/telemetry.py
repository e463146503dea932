"""``gpushare telemetry``: the newest counter window of each device, or windows as they close."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any

import click

from agent.cli import exits
from agent.cli.client import AgentUnreachable, get_node
from agent.cli.common import local_socket, resolve_settings
from agent.cli.render import message_dict, table
from agent.core.units import format_bytes

COLUMNS = ["DEVICE", "WINDOW", "N", "GPU UTIL", "SM ACTIVE", "DRAM", "FB USED", "POWER", ""]


def _pct(values: Any, name: str, scale: float = 1.0) -> str:
    return f"{values[name] * scale:.0f}%" if name in values else "-"


def window_row(window: Any, *, stale: bool) -> list[object]:
    mean = window.mean
    fb = format_bytes(int(mean["fb_used_bytes"])) if "fb_used_bytes" in mean else "-"
    return [
        window.device_uuid,
        time.strftime("%H:%M:%S", time.localtime(window.start_at)),
        window.sample_count,
        f"{_pct(mean, 'gpu_util')} (max {_pct(window.max, 'gpu_util')})",
        _pct(mean, "sm_active", 100),
        _pct(mean, "dram_active", 100),
        fb,
        f"{mean['power_w']:.0f} W" if "power_w" in mean else "-",
        "STALE" if stale else "",
    ]


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing windows as they close.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per window.")
@click.option(
    "--poll",
    "poll_s",
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="How often --follow asks the agent.",
)
@click.pass_context
def telemetry(ctx: click.Context, follow: bool, as_json: bool, poll_s: float) -> None:
    """Counter windows per device (mean and max over telemetry.window_s) and their source."""
    settings = resolve_settings(ctx.find_root())
    seen: set[tuple[str, float]] = set()
    first = True
    stop = threading.Event()
    if follow:  # Ctrl-C ends the loop between two calls (a call in flight is not cut)
        signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    while not stop.is_set():
        node = _node(local_socket(ctx, settings))
        fresh = [w for w in node.latest_windows if (w.device_uuid, w.start_at) not in seen]
        seen.update((w.device_uuid, w.start_at) for w in fresh)
        _print(node, fresh, as_json=as_json, header=first)
        first = False
        if not follow:
            return
        stop.wait(poll_s)


def _node(socket_path: str) -> Any:
    try:
        return get_node(socket_path)
    except AgentUnreachable as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.UNREACHABLE)


def _print(node: Any, windows: list[Any], *, as_json: bool, header: bool) -> None:
    stale = set(node.stale_devices)
    if as_json:
        for w in windows:
            click.echo(
                json.dumps(
                    {
                        **message_dict(w),
                        "stale": w.device_uuid in stale,
                        "source": node.telemetry_source,
                    }
                )
            )
        return
    rows = [window_row(w, stale=w.device_uuid in stale) for w in windows]
    if header:
        click.echo(f"source: {node.telemetry_source or '-'}; stale: {len(stale)} device(s)")
        if not rows:
            click.echo("no window has closed yet (windows last telemetry.window_s)")
            return
        click.echo(table(COLUMNS, rows))
        return
    if rows:
        click.echo("\n".join(table(COLUMNS, rows).splitlines()[1:]))
        sys.stdout.flush()
