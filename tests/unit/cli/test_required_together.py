"""Missing required options are named together, not one per try."""

from __future__ import annotations

import click
from click.testing import CliRunner

from agent.cli.common import AllRequired


@click.command(cls=AllRequired)
@click.option("--data", required=True)
@click.option("--out", required=True, envvar="TEST_OUT")
@click.option("--trees", default=3)
def command(data: str, out: str, trees: int) -> None:
    click.echo(f"{data} {out} {trees}")


def test_every_missing_option_is_named_at_once() -> None:
    result = CliRunner().invoke(command, [], env={"TEST_OUT": ""})
    assert result.exit_code == 2
    assert "missing required options: --data, --out" in result.output


def test_one_missing_option_gets_clicks_own_message() -> None:
    result = CliRunner().invoke(command, ["--data", "d"], env={"TEST_OUT": ""})
    assert result.exit_code == 2
    assert "Missing option '--out'" in result.output


def test_an_environment_variable_counts_and_help_still_works() -> None:
    result = CliRunner().invoke(command, ["--data", "d"], env={"TEST_OUT": "o"})
    assert result.exit_code == 0 and result.output == "d o 3\n"
    shown = CliRunner().invoke(command, ["--help"])
    assert shown.exit_code == 0 and "[required]" in shown.output


def test_a_bad_value_is_still_reported_as_such() -> None:
    result = CliRunner().invoke(command, ["--trees", "x"], env={"TEST_OUT": ""})
    assert result.exit_code == 2
    assert "missing required options: --data, --out" in result.output or "'x'" in result.output
