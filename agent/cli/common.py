"""What every command shares: settings resolution and failing with an exit code."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from agent.cli import exits
from agent.cli.client import AgentRefused, AgentUnreachable, Endpoint, Where
from agent.client.local import DEFAULT_CONFIG, agent_socket
from agent.config import Settings, load_settings
from agent.core.errors import ConfigError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class AllRequired(click.Command):
    """A command that names every missing required option at once, not the first only."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing and not set(args) & set(ctx.help_option_names):
            trial = self.make_context(
                ctx.info_name, list(args), parent=ctx.parent, resilient_parsing=True
            )
            missing = [
                p.opts[-1]
                for p in self.get_params(trial)
                if isinstance(p, click.Option) and p.required and trial.params.get(p.name) is None
            ]
            if len(missing) > 1:
                raise click.UsageError(f"missing required options: {', '.join(missing)}", ctx)
        return super().parse_args(ctx, args)


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
    return agent_socket(settings, named=bool(ctx.find_root().obj.get("socket")))


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


def sim_option(help_text: str) -> Callable[[F], F]:
    """``--sim [NODE.yaml]``: a simulated node (4 x H100 80GB, or NODE.yaml's devices)."""
    return click.option(
        "--sim", "sim", is_flag=False, flag_value="-", default=None, metavar="[NODE.yaml]",
        help=help_text,
    )  # fmt: skip


def set_option(example: str) -> Callable[[F], F]:
    return click.option(
        "--set", "assignments", multiple=True, metavar="KEY=VALUE",
        help=f"Override any setting, e.g. --set {example} (repeatable).",
    )  # fmt: skip


def assignments(items: tuple[str, ...], sim: str | None = None) -> dict[str, Any]:
    """``--set KEY=VALUE`` items (and ``--sim``) as setting overrides; exits 2 on a bad one."""
    result: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--set expects KEY=VALUE (got {item!r})", exits.CONFIG)
        result[key.strip()] = value
    if sim is not None:
        result["sim.enabled"] = True
        if sim != "-":
            result["sim.node_file"] = sim
    return result


def agent_where(ctx: click.Context) -> Where:
    """The agent to ask: its Unix socket, or the TCP endpoint given with --target."""
    root = ctx.find_root()
    return resolve_endpoint(root, resolve_settings(root))


def guarded(action: Callable[[], T]) -> T:
    """Run one call to the agent; its failures end the command with their exit code: the
    agent unreachable (4), a malformed request (2, a usage error), any other refusal (1)."""
    try:
        return action()
    except AgentUnreachable as exc:
        fail(str(exc), exits.UNREACHABLE)
    except AgentRefused as exc:
        if exc.invalid_argument:
            fail(str(exc), exits.CONFIG)
        fail(f"the agent refused: {exc}", exits.FAILURE)
