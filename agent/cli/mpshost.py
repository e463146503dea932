"""``gpushare mps host``: run the node's MPS control daemons apart from the agent."""

from __future__ import annotations

import asyncio
import os
import sys

import click

from agent.cli import exits
from agent.cli.common import CONTEXT, fail, resolve_settings, set_option, sim_option
from agent.cli.common import assignments as parse_assignments
from agent.config.loading import simulation_paths
from agent.core.errors import AlreadyRunningError, ConfigError, GpushareError

HOST_UMASK = 0o077  # the lock file; the MPS directories set their own modes


@click.command("host", context_settings=CONTEXT)
@sim_option("Keep the daemons of a simulated node (the same paths as `serve --sim`).")
@set_option("mps.root_dir=/run/gpushare/mps")
@click.pass_context
def mps_host(ctx: click.Context, sim: str | None, assignments: tuple[str, ...]) -> None:
    """Start and keep each device's MPS control daemon, in the foreground, until SIGTERM
    or SIGINT (which quit them).

    For agents with mps.launch 'host': the agent adopts these daemons, applies their
    defaults and per-lease limits and watches them, but never starts or stops one, so an
    agent restart or upgrade never restarts a daemon. Run it with the agent's
    configuration (same mps.root_dir), as its own DaemonSet (updateStrategy: OnDelete)
    or systemd unit. Exits 3 if another host keeps the same MPS root.
    """
    from agent.cli.logs import setup_logging
    from agent.runtime.mpshost import run_host

    flags = parse_assignments(assignments, sim)
    previous_umask = os.umask(HOST_UMASK)
    try:
        settings = simulation_paths(resolve_settings(ctx, flags))
        setup_logging(level=settings.runtime.log_level, fmt=settings.runtime.log_format)
        asyncio.run(run_host(settings))
    except ConfigError as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    except AlreadyRunningError as exc:
        fail(str(exc), exits.ALREADY_RUNNING)
    except GpushareError as exc:
        fail(str(exc), exits.FAILURE)
    finally:
        os.umask(previous_umask)
    sys.exit(exits.OK)
