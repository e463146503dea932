"""What both paths' loopback clusters share: waiting for a condition, and the settings and
flags of a simulated node's agent (``gpushare serve --sim``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# the settings every simulated node's agent gets, whatever the path
SIM_NODE_SETTINGS: dict[str, Any] = {
    "estimator.model_dir": "none",
    # the simulated MPS daemons are Python processes: on a loaded 2-core machine they may
    # take seconds to answer, which is not what these tests are about
    "mps.command_timeout_s": 20,
    "mps.start_timeout_s": 60,
    "mps.hung_after_probes": 5,
    # a stop ends the node: its MPS daemons go with the agent (a kill -9 leaves them, and
    # the next agent adopts them)
    "runtime.on_stop": "quit",
}


def node_settings(root: Path, **path_settings: Any) -> dict[str, Any]:
    """A simulated node's agent settings: its directories under ``root``, the shared
    :data:`SIM_NODE_SETTINGS`, then those of its path (which win)."""
    return {
        "paths.runtime_dir": root,
        "paths.state_dir": root / "state",
        **SIM_NODE_SETTINGS,
        **path_settings,
    }


def set_flags(settings: Mapping[str, Any]) -> list[str]:
    """``--set key=value`` for each setting, as ``gpushare serve`` takes them."""
    return [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]


async def eventually(
    predicate: Callable[[], Any], timeout_s: float = 20.0, poll_s: float = 0.02
) -> None:
    """Wait until ``predicate()`` holds (TimeoutError after ``timeout_s``)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(poll_s)
