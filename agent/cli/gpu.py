"""``gpushare gpu reset-compute-mode``: the node's GPUs back from EXCLUSIVE_PROCESS to
DEFAULT, for an uninstall (the chart's reset DaemonSet runs it on each node).

An agent that starts or adopts a GPU's MPS daemon sets EXCLUSIVE_PROCESS again, so the
command first takes the agent's own single-agent lock (:class:`~agent.runtime.lock.
InstanceLock`, on the socket and the MPS root, the agent's settings telling where),
waiting for a running agent to stop, and keeps it until it exits: no agent of the node
starts meanwhile (one that tries waits ``runtime.lock_wait_s``, then exits 3)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import click

from agent.cli import exits
from agent.cli.common import CONTEXT, fail, resolve_settings, set_option, sim_option
from agent.cli.common import assignments as parse_assignments
from agent.config import Settings
from agent.config.loading import simulation_paths
from agent.core.errors import AlreadyRunningError, ConfigError, GpushareError, SimulationError
from agent.gpu.compute_mode import ComputeModeReader, GpuReset
from agent.gpu.port import GpuBackend
from agent.runtime.lock import InstanceLock

PROGRESS_EVERY_S = 10.0  # a line while waiting for the agent, this often


@click.group(context_settings=CONTEXT)
def gpu() -> None:
    """The node's GPUs themselves (not the agent's view of them)."""


@gpu.command("reset-compute-mode", context_settings=CONTEXT)
@sim_option(
    "The simulated node's GPUs, whose compute modes are kept in sim-compute-modes.json in "
    "its runtime directory (docs/cli.md)."
)
@set_option("paths.runtime_dir=/run/gpushare-sim")
@click.option(
    "--done-file",
    metavar="PATH",
    default="",
    help="Once every GPU is reset, write what was done to PATH (a readiness probe's file).",
)
@click.option(
    "--wait-agent-s",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="How long to wait for the node's agent to stop (its single-agent lock); "
    "0: exit 3 at once if an agent runs.",
)
@click.option(
    "--hold",
    is_flag=True,
    help="Then stay running until SIGTERM or SIGINT (exit 0): the container of a DaemonSet.",
)
@click.pass_context
def reset_compute_mode(
    ctx: click.Context,
    sim: str | None,
    assignments: tuple[str, ...],
    done_file: str,
    wait_agent_s: float,
    hold: bool,
) -> None:
    """Set every whole GPU of this node that is in EXCLUSIVE_PROCESS (the agent's mode while
    MPS serves it) to DEFAULT, read it back, and print per GPU what was done. Other modes,
    and GPUs with MIG enabled, are left as they are.

    First it takes the agent's single-agent lock (an agent that starts or adopts an MPS
    daemon sets EXCLUSIVE_PROCESS again), waiting up to --wait-agent-s for a running agent
    to stop, and holds it until the command exits (with --hold: until SIGTERM). Run it as
    root with the agent's configuration (--config), which says where the lock is. Exits 1
    naming each GPU that refused, with NVML's error (no done file is written then), 2 on a
    configuration error, 3 when an agent still runs after --wait-agent-s."""
    settings = simulation_paths(resolve_settings(ctx, parse_assignments(assignments, sim)))
    lock = InstanceLock(settings.unix_socket_path, mps_root=settings.mps_root_dir)
    try:
        _wait_for_agent(lock, wait_agent_s)
        _reset_and_say(settings, done_file)
        if hold:
            _hold_until_stopped()
    finally:
        lock.release()
    sys.exit(exits.OK)


def _wait_for_agent(lock: InstanceLock, wait_s: float, *, poll_s: float = 0.2) -> None:
    """Take the agent's lock (the agent's own call), trying again for up to ``wait_s``
    while an agent holds it, with a line on stderr every :data:`PROGRESS_EVERY_S` (stdout
    is what was done to the GPUs)."""
    started = time.monotonic()
    said_at = None
    while True:
        try:
            lock.acquire()  # the agent's own call: every lock of the agent's, or none
        except AlreadyRunningError as exc:
            waited_s = time.monotonic() - started
            if waited_s >= wait_s:
                fail(
                    f"the agent still runs after {wait_s:g} s, so no GPU was reset "
                    f"(it would set EXCLUSIVE_PROCESS again): {exc}",
                    exits.ALREADY_RUNNING,
                )
            if said_at is None:
                say(f"waiting up to {wait_s:g} s for the agent to stop: {exc}")
                said_at = waited_s
            elif waited_s - said_at >= PROGRESS_EVERY_S:
                say(f"still waiting for the agent to stop: {waited_s:.0f} of {wait_s:g} s")
                said_at = waited_s
            time.sleep(poll_s)
        except ConfigError as exc:
            fail(f"configuration error: {exc}", exits.CONFIG)
        else:
            gone = "the agent stopped" if said_at is not None else "no agent runs"
            say(f"{gone}: its lock {lock.path} is held until this command exits")
            return


def say(line: str) -> None:
    click.echo(line, err=True)


def _reset_and_say(settings: Settings, done_file: str) -> None:
    try:
        results = asyncio.run(_reset(settings))
    except (ConfigError, SimulationError) as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    except GpushareError as exc:
        fail(str(exc), exits.FAILURE)
    for result in results:
        click.echo(result.line(), err=result.failed)
    failed = [r for r in results if r.failed]
    if failed:
        fail(f"{len(failed)} of {len(results)} GPU(s) not reset", exits.FAILURE)
    if not results:
        click.echo("no GPU on this node")
    if done_file:
        _write_done(Path(done_file), results)


async def _reset(settings: Settings) -> list[GpuReset]:
    from agent.gpu.compute_mode import reset_exclusive

    backend, reader = _ports(settings)
    await backend.start()
    try:
        return await reset_exclusive(backend, reader)
    finally:
        await backend.aclose()


def _ports(settings: Settings) -> tuple[GpuBackend, ComputeModeReader]:
    """The simulated node's GPUs and file of modes, or NVML's."""
    if settings.sim.enabled:
        from agent.gpu.sim_modes import MODES_FILE, FileComputeModes, SimModesGpuBackend
        from agent.runtime.checks import load_sim_spec

        modes = FileComputeModes(Path(settings.paths.runtime_dir) / MODES_FILE)
        devices = load_sim_spec(settings.sim.node_file).devices
        return SimModesGpuBackend(devices, modes), modes
    from agent.gpu.nvml import NvmlGpuBackend
    from agent.gpu.nvml_modes import NvmlComputeModes

    return NvmlGpuBackend(), NvmlComputeModes()


def _write_done(path: Path, results: list[GpuReset]) -> None:
    """What was done, written whole or not at all (a probe never reads half a file)."""
    partial = path.with_name(path.name + ".new")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text("".join(f"{r.line()}\n" for r in results) or "no GPU\n")
        os.replace(partial, path)
    except OSError as exc:
        fail(f"cannot write --done-file {path}: {exc.strerror}", exits.FAILURE)


def _hold_until_stopped() -> None:
    stop = asyncio.Event()

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()

    asyncio.run(wait())
