"""Where this node's agent listens, found the way ``gpushare`` finds it: ``GPUSHARE_SOCKET``;
else the settings (``GPUSHARE_CONFIG``, or ``/etc/gpushare/config.yaml`` when present, and
the ``GPUSHARE_*`` environment); their socket when it was named or exists, else a
simulated agent's (``gpushare serve --sim`` on default paths) when that one exists."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from agent.config import Settings, load_settings
from agent.config.loading import simulation_paths
from agent.config.settings import SimSettings

DEFAULT_CONFIG = "/etc/gpushare/config.yaml"


def node_settings(config_path: str | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """The settings of this node: ``config_path``, else ``GPUSHARE_CONFIG``, else the
    default file when present; the ``GPUSHARE_*`` environment over them."""
    environ = os.environ if env is None else env
    path = config_path or environ.get("GPUSHARE_CONFIG") or None
    if path is None and os.path.exists(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    text = Path(path).read_text() if path else None
    return load_settings(text, env=environ, overrides={}, source=path or "config")


def agent_socket(settings: Settings, *, named: bool = False) -> str:
    """The agent's Unix socket under ``settings``: theirs when it was ``named`` (a flag) or
    set, or when it exists; else a simulated agent's when that one exists."""
    path = settings.unix_socket_path
    if named or settings.api.unix_socket or os.path.exists(path):
        return path
    sim = simulation_paths(dataclasses.replace(settings, sim=SimSettings(enabled=True)))
    return sim.unix_socket_path if os.path.exists(sim.unix_socket_path) else path


def find_socket(env: Mapping[str, str] | None = None) -> str:
    """This node's agent socket, as ``gpushare`` would find it."""
    environ = os.environ if env is None else env
    return environ.get("GPUSHARE_SOCKET") or agent_socket(node_settings(env=environ))
