"""``gpushare profile``: measure workloads on this node's GPU into estimator run records."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from agent.cli import exits
from agent.cli.common import AllRequired, resolve_settings
from agent.core.errors import ConfigError, GpushareError, ValidationError
from agent.estimator.records import Record, to_json


@click.command(cls=AllRequired)
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="YAML: version 1, workloads with name, command, throughput_regex, memory.",
)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="JSON Lines output.")
@click.option("--device", "device_index", default=0, show_default=True, help="GPU index.")
@click.option(
    "--duration", "duration_s", default=60.0, show_default=True, help="Seconds each run lasts."
)
@click.option(
    "--warmup",
    "warmup_s",
    default=10.0,
    show_default=True,
    help="Seconds of output ignored at the start of each run.",
)
@click.option(
    "--threads",
    default="50,100",
    show_default=True,
    help="Thread percentages to pair workloads at.",
)
@click.option("--sim", is_flag=True, help="Run on the simulated node (to try a spec out).")
@click.pass_context
def profile(
    ctx: click.Context,
    spec_path: str,
    out: str,
    device_index: int,
    duration_s: float,
    warmup_s: float,
    threads: str,
    sim: bool,
) -> None:
    """Run each workload alone, then every pair under MPS at the given thread percentages,
    sampling the device's counters and reading each workload's throughput from its output.
    Run it where no agent manages the GPU (it starts its own MPS control daemon)."""
    from agent.learning.profiler import WorkloadSpec, load_spec
    from agent.node.events import EventLog
    from agent.runtime.wiring import start_profiler

    settings = resolve_settings(ctx.find_root(), {"sim.enabled": True} if sim else {})
    try:
        pcts = [float(x) for x in threads.split(",") if x.strip()]
    except ValueError:
        click.echo(f"gpushare: --threads: not a list of numbers: {threads!r}", err=True)
        sys.exit(exits.CONFIG)

    async def run(specs: list[WorkloadSpec]) -> list[Record]:
        profiler, stop = await start_profiler(
            settings,
            device_index=device_index,
            duration_s=duration_s,
            warmup_s=warmup_s,
            events=EventLog(),
        )
        try:
            return await profiler.run(specs, pcts)
        finally:
            await stop()

    try:
        records = asyncio.run(run(load_spec(spec_path)))
    except (ValidationError, ConfigError) as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)
    except GpushareError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.FAILURE)
    Path(out).write_text("".join(to_json(r) + "\n" for r in records))
    click.echo(f"wrote {len(records)} records to {out}")
