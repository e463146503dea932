"""`--sim` never uses the production paths unless they are set explicitly; the CLI finds a
simulated agent when no production agent listens."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from agent.cli.common import local_socket
from agent.config import load_settings
from agent.config.loading import simulation_paths
from agent.config.settings import PathSettings

DEFAULTS = PathSettings()


@pytest.mark.parametrize(
    ("overrides", "runtime", "state"),
    [
        ({}, DEFAULTS.runtime_dir, DEFAULTS.state_dir),
        ({"sim.enabled": True}, DEFAULTS.runtime_dir + "-sim", DEFAULTS.state_dir + "-sim"),
        (
            {"sim.enabled": True, "paths.state_dir": "/srv/s"},
            DEFAULTS.runtime_dir + "-sim",
            "/srv/s",
        ),
        (
            {"sim.enabled": True, "paths.runtime_dir": "/srv/r"},
            "/srv/r",
            DEFAULTS.state_dir + "-sim",
        ),
    ],
)
def test_simulation_paths(overrides: dict[str, object], runtime: str, state: str) -> None:
    paths = simulation_paths(load_settings(overrides=overrides)).paths
    assert (paths.runtime_dir, paths.state_dir) == (runtime, state)


def test_the_cli_finds_a_simulated_agent_when_no_production_one_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    production = load_settings(overrides={"paths.runtime_dir": str(tmp_path / "run")})
    sim_socket = tmp_path / "run-sim" / "agent.sock"
    monkeypatch.setattr("agent.config.settings.default_runtime_dir", lambda: str(tmp_path / "run"))
    ctx = click.Context(click.Command("x"), obj={"socket": None})
    assert local_socket(ctx, production) == str(tmp_path / "run" / "agent.sock")  # neither
    sim_socket.parent.mkdir()
    sim_socket.touch()
    assert local_socket(ctx, production) == str(sim_socket)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "agent.sock").touch()
    assert local_socket(ctx, production) == str(tmp_path / "run" / "agent.sock")  # production first
    named = click.Context(click.Command("x"), obj={"socket": "/elsewhere.sock"})
    assert local_socket(named, production) == production.unix_socket_path
