"""Every ``$ gpushare ...`` example in docs/cli.md, run in order against a real
``gpushare serve --sim`` agent: each exits with the code the doc gives (``# exits N``, else
0) and prints the lines the doc shows, in order (numbers, times, PIDs and UUIDs may differ;
a ``...`` line stands for any lines)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from tests.helpers import REPO, agent_command, short_dir, spawn_agent, subprocess_env

DOC = REPO / "docs" / "cli.md"
EXIT_NOTE = re.compile(r"\s+#\s*exits\s+(\d+)\s*$")
UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
LEASE = re.compile(r"l-[A-Za-z0-9_-]{16}")
VARYING = re.compile(r"(GPU-[0-9a-f-]{36}|\bl-[A-Za-z0-9_-]{16}\b|\d+(?:\.\d+)?| {2,})")


@dataclass(frozen=True)
class Example:
    command: str
    exit_code: int
    expected: tuple[str, ...]


def examples(text: str) -> list[Example]:
    """The ``$ gpushare`` lines of the doc's code blocks, each with the lines under it."""
    found: list[Example] = []
    for block in re.findall(r"```\n(.*?)```", text, flags=re.S):
        lines = block.rstrip("\n").split("\n")
        if not lines[0].startswith("$ gpushare"):
            continue
        starts = [i for i, line in enumerate(lines) if line.startswith("$ ")]
        for start, end in zip(starts, [*starts[1:], len(lines)], strict=True):
            command = lines[start][2:]
            note = EXIT_NOTE.search(command)
            found.append(
                Example(
                    EXIT_NOTE.sub("", command),
                    int(note.group(1)) if note else 0,
                    tuple(lines[start + 1 : end]),
                )
            )
    return found


def line_pattern(line: str) -> re.Pattern[str]:
    """A doc line as a pattern: UUIDs, lease ids, numbers and runs of spaces may differ."""
    parts = []
    for piece in VARYING.split(line):
        if UUID.fullmatch(piece) or LEASE.fullmatch(piece):
            parts.append((UUID if UUID.fullmatch(piece) else LEASE).pattern)
        elif re.fullmatch(r"\d+(?:\.\d+)?", piece):
            parts.append(r"\d+(?:\.\d+)?")
        elif piece and piece.strip() == "":
            parts.append(r" +")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts) + r"\s*$")


def missing_lines(expected: tuple[str, ...], output: str) -> list[str]:
    """Doc lines not found in the output in order (``...`` skips any number of lines)."""
    lines = output.rstrip("\n").split("\n")
    at, missing = 0, []
    for line in expected:
        if line.strip() == "...":
            continue
        pattern = line_pattern(line)
        hit = next((i for i in range(at, len(lines)) if pattern.match(lines[i])), None)
        if hit is None:
            missing.append(line)
        else:
            at = hit + 1
    return missing


@pytest.fixture(scope="module")
def session() -> Iterator[Path]:
    """A simulated agent with one lease, and a working directory for the examples' files."""
    with short_dir() as root:
        agent = spawn_agent(root, *QUIT_AT_STOP, *NAMED, "--set", "telemetry.window_s=1")
        try:
            wait_for_socket(root, agent)
            admit_one(root)
            time.sleep(1.5)  # a closed telemetry window for `gpushare telemetry`
            yield root
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=20)


def wait_for_socket(root: Path, agent: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert agent.poll() is None, (root / "agent.log").read_text()
        if (root / "agent.log").exists() and "agent ready" in (root / "agent.log").read_text():
            return
        time.sleep(0.1)
    raise AssertionError("the agent did not start")


def admit_one(root: Path) -> None:
    with grpc.insecure_channel(f"unix:{root / 'agent.sock'}") as channel:
        pb_grpc.AgentStub(channel).Admit(
            pb.AdmitRequest(
                request=pb.Request(
                    request_id="train-42",
                    tenant="team-a",
                    trust_domain="team-a",
                    priority=pb.BURSTABLE,
                    memory_bytes=20 * 2**30,
                    thread_pct=25,
                    pod="team-a/train-42-0",
                    run_as_uid=1000,
                )
            ),
            timeout=5,
        )


def run(root: Path, command: str) -> subprocess.CompletedProcess[str]:
    args = shlex.split(command)
    assert args[0] == "gpushare"
    env = {**subprocess_env(), "GPUSHARE_SOCKET": str(root / "agent.sock")}
    env.pop("GPUSHARE_CONFIG", None)
    return subprocess.run(
        agent_command(*args[1:]),
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in the order a terminal shows it
        text=True,
        timeout=120,
        check=False,
    )


ALL = examples(DOC.read_text())
QUIT_AT_STOP = ("--set", "runtime.on_stop=quit")  # leave no MPS daemon behind
NAMED = ("--set", "runtime.node_name=worker-1")  # the doc's node


def test_the_doc_has_an_example_of_every_command() -> None:
    shown = {" ".join(shlex.split(e.command)[1:3]) for e in ALL}
    for command in (
        "status", "config show", "mps status", "telemetry", "leases", "explain --memory",
        "size --parameters", "drain 3", "undrain", "events", "clear-stale --dry-run",
        "release", "report", "events --kind",
        "estimator synth", "estimator train", "estimator predict", "estimator evaluate",
        "readiness synth", "readiness evaluate", "readiness train", "kube serve",
    ):  # fmt: skip
        assert any(s == command or s.startswith(command) for s in shown), command


@pytest.mark.timeout(150)  # training a model takes a while on 2 cores
@pytest.mark.parametrize("example", ALL, ids=[e.command for e in ALL])
def test_example(session: Path, example: Example) -> None:
    result = run(session, example.command)
    output = result.stdout
    assert result.returncode == example.exit_code, output
    assert not missing_lines(example.expected, output), output


def test_the_pattern_tells_a_changed_format() -> None:
    doc = ("IDX  UUID  STATE", "0    GPU-87bb7b7c-d302-2d72-f82c-0e8cd08e8c23  open")
    assert not missing_lines(
        doc, "IDX  UUID  STATE\n1  GPU-96222f07-1b1e-22e4-3d62-032b04d6aac6  open"
    )
    assert missing_lines(doc, "IDX UUID\n1  GPU-96222f07-1b1e-22e4-3d62-032b04d6aac6  open")
    assert missing_lines(doc[1:], "0  GPU-96222f07-1b1e-22e4-3d62-032b04d6aac6  closed")


def test_a_stopped_agent_is_named_with_what_to_do() -> None:
    with short_dir() as root:
        result = run(root, "gpushare status")
        assert result.returncode == 4
        assert "no agent socket at" in result.stdout
        agent = spawn_agent(root)
        wait_for_socket(root, agent)
        config = run(root, "gpushare config show")
        assert f"running agent's configuration (pid {agent.pid}," in config.stdout
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
        result = run(root, "gpushare status")
        assert result.returncode == 4
        assert "is a stale socket: no agent listens on it" in result.stdout
        assert "Traceback" not in result.stdout and "UNAVAILABLE" not in result.stdout
        config = run(root, "gpushare config show")
        assert f"no agent is running on {root / 'agent.sock'}" in config.stdout
        (root / "agent.log").unlink()
        again = spawn_agent(root, *QUIT_AT_STOP)  # as the hint says; it replaces the socket
        wait_for_socket(root, again)
        assert run(root, "gpushare status").returncode == 0
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=20) == 0
