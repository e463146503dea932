"""What every command shares: settings resolution and failing with an exit code."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import click

from agent.cli import exits
from agent.cli.client import Endpoint, Where
from agent.config import Settings, load_settings
from agent.config.settings import SimSettings, simulation_paths
from agent.core.errors import ConfigError

DEFAULT_CONFIG = "/etc/gpushare/config.yaml"
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"gpushare: {message}", err=True)
    sys.exit(code)


def resolve_settings(ctx: click.Context, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Effective settings for this invocation; exits 2 with the key on a bad value."""
    config_path: str | None = ctx.obj["config"]
    socket: str | None = ctx.obj["socket"]
    text = None
    path = config_path or (DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else None)
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            fail(f"cannot read config file {path}: {exc.strerror}", exits.CONFIG)
    flags = dict(overrides or {})
    if socket:
        flags["api.unix_socket"] = socket
    try:
        return load_settings(text, env=os.environ, overrides=flags, source=path or "config")
    except ConfigError as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)


def local_socket(ctx: click.Context, settings: Settings) -> str:
    """The agent's Unix socket; a simulated agent's (``serve --sim`` on default paths) when
    no socket was named and no production agent listens."""
    path = settings.unix_socket_path
    if ctx.find_root().obj.get("socket") or settings.api.unix_socket or os.path.exists(path):
        return path
    sim = simulation_paths(dataclasses.replace(settings, sim=SimSettings(enabled=True)))
    return sim.unix_socket_path if os.path.exists(sim.unix_socket_path) else path


def resolve_endpoint(ctx: click.Context, settings: Settings) -> Where:
    """The agent to ask: ``--target`` with its TLS files and token, else the Unix socket."""
    given: dict[str, str | None] = ctx.find_root().obj.get("endpoint") or {}
    target = given.get("target")
    if not target:
        return local_socket(ctx, settings)
    return Endpoint(
        target,
        ca_file=given.get("tls_ca") or "",
        cert_file=given.get("tls_cert") or "",
        key_file=given.get("tls_key") or "",
        token_file=given.get("token_file") or "",
        server_name=given.get("tls_server_name") or "",
    )
