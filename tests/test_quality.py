"""The architecture and hygiene checks, run as part of the test suite."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import REPO

PROTO_MODULES = ("agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py")
PROTO_SUFFIXES = ("_pb2.py", "_pb2_grpc.py")


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


WARN_LINES = 400  # a module this long is reported: is it one concern still?
MAX_LINES = 600  # a module of the agent, a test or a benchmark this long fails the suite


def line_counts(top: str) -> dict[str, int]:
    """Lines of each Python file under ``top``, generated protos aside."""
    return {
        str(path.relative_to(REPO)): len(path.read_text().splitlines())
        for path in (REPO / top).rglob("*.py")
        if "proto" not in path.parts and not path.name.endswith(PROTO_SUFFIXES)
    }


def report(title: str, counts: dict[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    """Say it on the terminal even while pytest captures output: a warning, not a failure."""
    if counts:
        with capsys.disabled():
            listed = "\n".join(f"  {n:5d} {path}" for path, n in sorted(counts.items()))
            print(f"\n{title}:\n{listed}")


def test_no_module_is_too_long(capsys: pytest.CaptureFixture[str]) -> None:
    """A module of the agent, a test or a benchmark over 600 lines fails; over 400 it is
    listed (a warning): the cut follows the concern and the import contracts, not a line
    count."""
    counts = line_counts("agent")
    others = {**line_counts("tests"), **line_counts("bench")}
    for title, found in (("agent modules", counts), ("test and benchmark files", others)):
        report(
            f"{title} over {WARN_LINES} lines",
            {p: n for p, n in found.items() if WARN_LINES < n <= MAX_LINES},
            capsys,
        )
    everything = {**counts, **others}
    too_long = {p: n for p, n in everything.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"


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


def test_architecture_map_is_up_to_date() -> None:
    """docs/architecture.md's map follows the import contracts, the folders' docstrings and
    the imports that exist."""
    from tests.architecture_map import DOC, updated

    checked_in = DOC.read_text()
    assert checked_in == updated(checked_in), (
        "docs/architecture.md's map is stale: python -m tests.architecture_map"
    )


def test_the_agents_surface_is_as_recorded() -> None:
    """Every command's help, every setting and its default, the metric names, the event
    kinds and the store's schema, as recorded in tests/data/surface.json: a change meant to
    move code only leaves them as they were; a change of behaviour records them anew."""
    import json

    from tests.surface import SNAPSHOT, differences, fresh

    changed = differences(json.loads(SNAPSHOT.read_text()), fresh())
    assert not changed, (
        f"the agent's surface changed ({', '.join(changed)}): if that is meant, "
        "python -m tests.surface, and say so in CHANGELOG.md"
    )
