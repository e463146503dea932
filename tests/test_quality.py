"""The architecture and hygiene checks, run as part of the test suite."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import REPO

PROTO_MODULES = ("agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py")


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a tool installed beside this interpreter (the dev extra's console scripts)."""
    executable = Path(sys.executable).parent / args[0]
    return subprocess.run(
        [str(executable), *args[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "command",
    [
        ("ruff", "check", "."),
        ("ruff", "format", "--check", "."),
        ("mypy",),
        ("lint-imports",),
    ],
    ids=["ruff", "ruff-format", "mypy-strict", "import-linter"],
)
def test_tool_passes(command: tuple[str, ...]) -> None:
    result = run_tool(*command)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}"


def test_generated_grpc_code_is_up_to_date() -> None:
    from agent.api.proto.generate import generate

    with tempfile.TemporaryDirectory() as out:
        generate(REPO, Path(out))
        fresh = Path(out) / "agent" / "api" / "proto"
        for name in PROTO_MODULES:
            checked_in = (REPO / "agent" / "api" / "proto" / name).read_text()
            assert (fresh / name).read_text() == checked_in, (
                f"{name} is stale: run python -m agent.api.proto.generate"
            )


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    commands = [line.strip() for line in readme.split("```")[1].strip().splitlines()]
    assert len(commands) == 2, "the README starts with exactly two commands"
    assert "gpushare serve --sim" in commands[0]
    assert "pytest" in commands[1]
    assert commands[1] in ci, ".ci/run must call the README's test command as written"


def test_no_module_is_too_long() -> None:
    too_long = {
        str(path.relative_to(REPO)): n
        for path in (REPO / "agent").rglob("*.py")
        if "proto" not in path.parts and (n := len(path.read_text().splitlines())) > 400
    }
    assert not too_long, f"modules over 400 lines: {too_long}"


def test_configuration_reference_is_up_to_date() -> None:
    from agent.config.reference import render

    checked_in = (REPO / "docs" / "configuration.md").read_text()
    assert checked_in == render(), (
        "docs/configuration.md is stale: python -m agent.config.reference > docs/configuration.md"
    )


def test_api_reference_is_up_to_date() -> None:
    from agent.api.proto.reference import PROTO, reference

    checked_in = (REPO / "docs" / "api.md").read_text()
    assert checked_in == reference(PROTO.read_text()), (
        "docs/api.md is stale: python -m agent.api.proto.reference > docs/api.md"
    )
