"""`gpushare serve --sim` as a real subprocess: status, signals, a second instance, bad config."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers import agent_command, short_dir, subprocess_env

START_WITHIN_S = 15
STOP_WITHIN_S = 10


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def serve(root: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        agent_command(
            "--socket",
            str(root / "agent.sock"),
            "serve",
            "--sim",
            "--http-listen",
            "127.0.0.1:0",
            "--set",
            f"paths.runtime_dir={root}",
            "--set",
            f"paths.state_dir={root}/state",
            *extra,
        ),
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def status_json(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_command("--socket", str(root / "agent.sock"), "status", "--json", "--timeout", "2"),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def wait_for_devices(root: Path, agent: subprocess.Popen[str]) -> dict[str, object]:
    deadline = time.monotonic() + START_WITHIN_S
    while time.monotonic() < deadline:
        assert agent.poll() is None, f"agent exited early: {agent.communicate()[1]}"
        result = status_json(root)
        if result.returncode == 0:
            node: dict[str, object] = json.loads(result.stdout)
            return node
        time.sleep(0.2)
    raise AssertionError(f"no answer from the agent within {START_WITHIN_S} s")


def stop(agent: subprocess.Popen[str], signum: int) -> tuple[int, float, str]:
    started = time.monotonic()
    agent.send_signal(signum)
    try:
        _out, err = agent.communicate(timeout=STOP_WITHIN_S + 5)
    except subprocess.TimeoutExpired:
        agent.kill()
        raise
    return agent.returncode, time.monotonic() - started, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_status_and_clean_stop(root: Path, signum: int) -> None:
    agent = serve(root)
    try:
        node = wait_for_devices(root, agent)
        devices = node["devices"]
        assert isinstance(devices, list) and len(devices) == 4
        assert node["simulated"] is True
        assert {d["model"] for d in devices} == {"H100-SXM5-80GB"}
        children = psutil.Process(agent.pid).children(recursive=True)
        daemons = [m["pid"] for m in node["mps"]]  # type: ignore[union-attr]
        assert len(daemons) == 4 and {c.pid for c in children} >= set(daemons)
    finally:
        code, took_s, err = stop(agent, signum)
    assert code == 0, err
    assert took_s < STOP_WITHIN_S
    assert "agent stopped cleanly" in err
    assert not [c for c in children if c.is_running() and c.status() != "zombie"], (
        "child processes left behind"
    )
    assert not (root / "agent.sock").exists()
    assert not (root / "mps").exists(), "MPS directories left behind"


def test_mps_status_direct_reads_the_live_daemons(root: Path) -> None:
    agent = serve(root, "--set", "mps.default_thread_pct=60")
    try:
        node = wait_for_devices(root, agent)
        direct = subprocess.run(
            agent_command("mps", "status", "--direct", "--json", "--timeout", "3"),
            env={**subprocess_env(), "GPUSHARE_PATHS_RUNTIME_DIR": str(root)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert direct.returncode == 0, direct.stderr
        daemons = json.loads(direct.stdout)
        assert len(daemons) == 4
        assert {d["device_uuid"] for d in daemons} == {
            d["uuid"]
            for d in node["devices"]  # type: ignore[union-attr]
        }
        assert all(d["up"] and d["default_thread_pct"] == 60.0 for d in daemons)
        assert {d["pid"] for d in daemons} == {m["pid"] for m in node["mps"]}  # type: ignore[union-attr]
        table = subprocess.run(
            agent_command("--socket", str(root / "agent.sock"), "mps", "status"),
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert table.returncode == 0 and table.stdout.count(" up ") == 4
    finally:
        code, _took, err = stop(agent, signal.SIGTERM)
    assert code == 0, err


def test_second_agent_on_the_same_socket_refuses(root: Path) -> None:
    agent = serve(root)
    try:
        wait_for_devices(root, agent)
        second = subprocess.run(
            agent_command(
                "--socket", str(root / "agent.sock"), "serve", "--sim", "--http-listen", ""
            ),
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert second.returncode == 3
        assert f"pid {agent.pid}" in second.stderr and "already uses the socket" in second.stderr
        assert status_json(root).returncode == 0, "the first agent still answers"
    finally:
        code, _took, err = stop(agent, signal.SIGTERM)
    assert code == 0, err


def test_a_second_agent_on_another_socket_touches_nothing_of_the_first(root: Path) -> None:
    agent = serve(root)
    try:
        before = wait_for_devices(root, agent)
        second = subprocess.run(
            agent_command(
                "--socket", str(root / "other.sock"), "serve", "--sim", "--http-listen", "",
                "--set", f"paths.runtime_dir={root}", "--set", f"paths.state_dir={root}/state",
            ),
            env=subprocess_env(), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert second.returncode == 3, second.stderr
        assert f"pid {agent.pid}" in second.stderr and str(root / "agent.sock") in second.stderr
        assert "already uses the state directory" in second.stderr
        assert not (root / "other.sock").exists()
        after = json.loads(status_json(root).stdout)
        pids = [[d["pid"] for d in node["mps"]] for node in (before, after)]  # type: ignore[index, attr-defined]
        assert pids[0] == pids[1], "the first agent's daemons were replaced"
        assert "no lease" not in second.stderr and "migrat" not in second.stderr
    finally:
        code, _took, err = stop(agent, signal.SIGTERM)
    assert code == 0, err


def test_restart_after_kill_9_reclaims_the_socket(root: Path) -> None:
    agent = serve(root)
    wait_for_devices(root, agent)
    agent.kill()
    agent.communicate(timeout=10)
    assert (root / "agent.sock").exists(), "kill -9 leaves the socket file behind"
    again = serve(root)
    try:
        assert len(wait_for_devices(root, again)["devices"]) == 4  # type: ignore[arg-type]
    finally:
        code, _took, err = stop(again, signal.SIGTERM)
    assert code == 0, err


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("version: 1\napi:\n  http_listne: ':1'\n", "api.http_listne"),
        ("version: 1\ntelemetry:\n  sample_interval_s: -5\n", "telemetry.sample_interval_s"),
    ],
)
def test_bad_config_file_stops_start_up_with_exit_code_2(root: Path, text: str, key: str) -> None:
    config = root / "config.yaml"
    config.write_text(text)
    result = subprocess.run(
        agent_command("--config", str(config), "serve", "--sim"),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert key in result.stderr


def test_without_sim_and_without_a_driver_it_refuses_clearly(root: Path) -> None:
    from tests.conftest import nvml_unavailable_reason

    if nvml_unavailable_reason() is None:
        pytest.skip("this machine has an NVIDIA driver")
    result = subprocess.run(
        agent_command("--socket", str(root / "agent.sock"), "serve", "--http-listen", ""),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "gpushare serve --sim" in result.stderr
    assert "libnvidia-ml" in result.stderr


def test_simulated_node_runs_on_the_fake_front_end_too(root: Path) -> None:
    from tests.integration.mps.harness import FAKE_BINARY

    agent = serve(root, "--set", f"mps.control_binary={FAKE_BINARY}")
    try:
        node = wait_for_devices(root, agent)
        mps = node["mps"]
        assert isinstance(mps, list) and len(mps) == 4
        assert all(m["up"] and m["backend"] == FAKE_BINARY for m in mps)
    finally:
        code, _took, err = stop(agent, signal.SIGTERM)
    assert code == 0, err
    assert f"MPS control: {FAKE_BINARY}" in err


def test_telemetry_follow_prints_windows_as_they_close(root: Path) -> None:
    agent = serve(
        root,
        "--set",
        "telemetry.window_s=0.5",
        "--set",
        "telemetry.sample_interval_s=0.1",
        "--set",
        "telemetry.stale_after_s=2",
    )
    try:
        wait_for_devices(root, agent)
        with subprocess.Popen(
            agent_command(
                "--socket",
                str(root / "agent.sock"),
                "telemetry",
                "--follow",
                "--json",
                "--poll",
                "0.2",
            ),
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as follow:
            assert follow.stdout is not None
            windows = [json.loads(follow.stdout.readline()) for _ in range(12)]
            follow.send_signal(signal.SIGINT)
            assert follow.wait(timeout=10) == 0
        starts = {w["start_at"] for w in windows}
        assert len(starts) >= 3, "windows keep closing"
        assert {w["source"] for w in windows} == {"simulated"}
        assert all(w["sample_count"] >= 1 and "power_w" in w["mean"] for w in windows)
        table = subprocess.run(
            agent_command("--socket", str(root / "agent.sock"), "telemetry"),
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert table.returncode == 0 and table.stdout.startswith("source: simulated")
    finally:
        code, _took, err = stop(agent, signal.SIGTERM)
    assert code == 0, err
