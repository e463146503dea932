import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent import __version__
from agent.cli import exits
from agent.cli.main import cli

COMMANDS = [[], ["serve"], ["status"], ["config"], ["config", "show"]]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(runner: CliRunner, command: list[str]) -> None:
    result = runner.invoke(cli, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: " in result.output
    assert len(result.output.splitlines()) > 4


def test_version(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_config_show_applies_file_env_and_flags(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "version: 1\ntelemetry:\n  window_s: 20\n  sample_interval_s: 2\n  stale_after_s: 9\n"
    )
    result = runner.invoke(
        cli,
        ["--config", str(config), "--socket", "/x/agent.sock", "config", "show", "--json"],
        env={"GPUSHARE_TELEMETRY_SAMPLE_INTERVAL_S": "4"},
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert "as asked" in result.stderr  # a --config named on the command line is shown
    assert shown["version"] == 1
    assert shown["telemetry"]["window_s"] == 20.0
    assert shown["telemetry"]["sample_interval_s"] == 4.0
    assert shown["api"]["unix_socket"] == "/x/agent.sock"


def test_config_show_yaml_and_doc(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["config", "show"])
    assert result.exit_code == 0
    assert yaml.safe_load(result.output)["version"] == 1
    result = runner.invoke(cli, ["config", "show", "--doc"])
    assert "GPUSHARE_TELEMETRY_WINDOW_S" in result.output


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("version: 1\ntelemetry:\n  bogus: 1\n", "telemetry.bogus"),
        ("version: 1\ntelemetry:\n  sample_interval_s: -1\n", "telemetry.sample_interval_s"),
    ],
)
@pytest.mark.parametrize("command", [["config", "show"], ["serve", "--sim"]])
def test_bad_config_exits_2_naming_the_key(
    runner: CliRunner, tmp_path: Path, text: str, key: str, command: list[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    result = runner.invoke(cli, ["--config", str(config), *command])
    assert result.exit_code == exits.CONFIG
    assert key in result.output


def test_missing_config_file_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["--config", str(tmp_path / "nope.yaml"), "config", "show"])
    assert result.exit_code == exits.CONFIG
    assert "cannot read config file" in result.output


def test_bad_set_assignment(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["serve", "--sim", "--set", "no-equals-sign"])
    assert result.exit_code == exits.CONFIG
    assert "KEY=VALUE" in result.output


def test_bad_sim_node_file_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("version: 1\ndevices: [{model: x}]\n")
    result = runner.invoke(
        cli,
        ["--socket", str(tmp_path / "s.sock"), "serve", "--sim", str(node), "--http-listen", ""],
    )
    assert result.exit_code == exits.CONFIG
    assert "devices[0].memory" in result.output


@pytest.mark.parametrize("listen", ["0.0.0.0:7000", "127.0.0.1:7000"])
def test_tcp_listener_refuses_to_start_without_authentication(
    runner: CliRunner, tmp_path: Path, listen: str
) -> None:
    result = runner.invoke(
        cli, ["--socket", str(tmp_path / "s.sock"), "serve", "--sim", "--tcp-listen", listen]
    )
    assert result.exit_code == exits.CONFIG
    assert "api.tcp_listen" in result.output


def test_status_without_an_agent_exits_4(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["--socket", str(tmp_path / "none.sock"), "status"])
    assert result.exit_code == exits.UNREACHABLE
    assert "is the agent running" in result.output


def test_status_on_a_dead_socket_exits_4(runner: CliRunner, tmp_path: Path) -> None:
    import socket

    path = tmp_path / "dead.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the file stays, nobody listens
    result = runner.invoke(cli, ["--socket", str(path), "status", "--timeout", "1"])
    assert result.exit_code == exits.UNREACHABLE
    assert "is a stale socket: no agent listens on it" in result.output
