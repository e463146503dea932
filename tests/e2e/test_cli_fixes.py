"""The on-call commands as an engineer types them against a real simulated agent: release a
lease, find a refusal afterwards in the events, and the usage errors that say what to do."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from tests.e2e.test_cli_session import QUIT_AT_STOP, run, wait_for_socket
from tests.helpers import short_dir, spawn_agent


@pytest.fixture(scope="module")
def agent() -> Iterator[Path]:
    with short_dir() as root:
        process = spawn_agent(root, *QUIT_AT_STOP)
        try:
            wait_for_socket(root, process)
            yield root
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)


def admit(root: Path, request_id: str, memory_gib: int) -> pb.AdmitResponse:
    with grpc.insecure_channel(f"unix:{root / 'agent.sock'}") as channel:
        answer: pb.AdmitResponse = pb_grpc.AgentStub(channel).Admit(
            pb.AdmitRequest(
                request=pb.Request(
                    request_id=request_id,
                    tenant="team-a",
                    trust_domain="team-a",
                    priority=pb.BURSTABLE,
                    memory_bytes=memory_gib * 2**30,
                    thread_pct=10,
                    pod="team-a/" + request_id,
                )
            ),
            timeout=5,
        )
    return answer


def test_release_ends_a_lease_and_says_so_again(agent: Path) -> None:
    lease = admit(agent, "to-release", 2).lease.lease_id
    first = run(agent, f"gpushare release {lease}")
    assert first.returncode == 0 and f"lease {lease} released (team-a/to-release)" in first.stdout
    again = run(agent, f"gpushare release {lease}")
    assert again.returncode == 0 and "released" in again.stdout
    unknown = run(agent, "gpushare release l-AAAAAAAAAAAAAAAA")
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stdout


def test_a_refusal_is_found_afterwards_in_the_events(agent: Path) -> None:
    assert not admit(agent, "too-big", 500).decision.admitted
    found = run(agent, "gpushare events --kind lease.refused --since 10m --json")
    assert found.returncode == 0, found.stdout
    [event] = [json.loads(line) for line in found.stdout.splitlines()]
    assert event["attrs"]["request_id"] == "too-big" and event["attrs"]["reason"] == "NO_MEMORY"
    table = run(agent, "gpushare events --kind lease.")
    assert "lease.refused" in table.stdout and "lease.admitted" in table.stdout
    none = run(agent, "gpushare events --kind dra.")
    assert none.returncode == 0 and "no events match" in none.stdout
    bad = run(agent, "gpushare events --since yesterday")
    assert bad.returncode == 2 and "--since" in bad.stdout


def test_usage_errors_exit_2_and_say_what_to_do(agent: Path) -> None:
    threads = run(agent, "gpushare explain --memory 1GiB --threads 150")
    assert threads.returncode == 2 and "--threads" in threads.stdout
    drain = run(agent, "gpushare drain")
    assert drain.returncode == 2 and "give --all to drain the whole node" in drain.stdout
    both = run(agent, "gpushare drain 0 --all")
    assert both.returncode == 2
    everything = run(agent, "gpushare undrain --all")
    assert everything.returncode == 0 and "undrained" in everything.stdout


def test_config_show_with_a_named_file_shows_that_file(agent: Path) -> None:
    named = agent / "other.yaml"
    named.write_text("version: 1\nadmission:\n  max_clients: 7\n")
    shown = run(agent, f"gpushare --config {named} config show --json")
    assert shown.returncode == 0, shown.stdout
    values = json.loads(shown.stdout[shown.stdout.index("{") :])
    assert values["admission"]["max_clients"] == 7
    running = run(agent, "gpushare config show --json")
    assert json.loads(running.stdout[running.stdout.index("{") :])["admission"]["max_clients"] == 48


def test_a_stale_socket_names_the_unit_and_its_log() -> None:
    with short_dir() as root:
        process = spawn_agent(root)
        wait_for_socket(root, process)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        result = run(root, "gpushare status")
        assert result.returncode == 4
        assert "systemctl start gpushare-agent" in result.stdout
        assert "journalctl -u gpushare-agent" in result.stdout
