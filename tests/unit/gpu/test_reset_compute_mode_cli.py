"""`gpushare gpu reset-compute-mode` against the simulated node's GPUs, run as the reset
DaemonSet's container runs it: a real process, the GPUs' modes in the simulated driver's
file (they outlive processes, as a driver's do), stopped by SIGTERM; and beside a real
agent (`gpushare serve --sim`), whose single-agent lock it waits for and then holds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.core.types import Device
from agent.gpu.sim_modes import MODES_FILE
from agent.runtime.checks import load_sim_spec
from tests.helpers import agent_command, short_dir, spawn_agent, subprocess_env

EXCLUSIVE = {"mode": "EXCLUSIVE_PROCESS"}


@pytest.fixture
def gpus() -> list[Device]:
    return load_sim_spec("").devices  # the simulated node's 4 GPUs


def argv(runtime: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "agent", "gpu", "reset-compute-mode", "--sim",
        "--set", f"paths.runtime_dir={runtime}", *extra,
    ]  # fmt: skip


def write_modes(runtime: Path, table: dict[str, dict[str, object]]) -> None:
    (runtime / MODES_FILE).write_text(json.dumps(table))


def modes(runtime: Path, gpus: list[Device]) -> list[str]:
    table = json.loads((runtime / MODES_FILE).read_text())
    return [table.get(g.uuid, {}).get("mode", "DEFAULT") for g in gpus]


def test_every_exclusive_gpu_reads_default_afterwards_and_others_are_left(
    tmp_path: Path, gpus: list[Device]
) -> None:
    write_modes(
        tmp_path,
        {gpus[0].uuid: EXCLUSIVE, gpus[1].uuid: EXCLUSIVE, gpus[3].uuid: {"mode": "PROHIBITED"}},
    )
    done = tmp_path / "probe" / "done"
    run = subprocess.run(
        argv(tmp_path, "--done-file", str(done)),
        env=subprocess_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert modes(tmp_path, gpus) == ["DEFAULT", "DEFAULT", "DEFAULT", "PROHIBITED"]
    lines = run.stdout.splitlines()
    assert f"GPU 0 {gpus[0].uuid}: EXCLUSIVE_PROCESS -> DEFAULT (read back)" in lines
    assert f"GPU 1 {gpus[1].uuid}: EXCLUSIVE_PROCESS -> DEFAULT (read back)" in lines
    assert f"GPU 2 {gpus[2].uuid}: DEFAULT, left as it is" in lines
    assert f"GPU 3 {gpus[3].uuid}: PROHIBITED, left as it is" in lines
    assert done.read_text().splitlines() == lines  # what the probe reads: what was done


def test_a_gpu_that_refuses_fails_the_command_with_nvmls_error_and_no_done_file(
    tmp_path: Path, gpus: list[Device]
) -> None:
    write_modes(
        tmp_path, {gpus[0].uuid: EXCLUSIVE, gpus[2].uuid: {**EXCLUSIVE, "refuse": 4}}
    )  # 4: NVML_ERROR_NO_PERMISSION
    done = tmp_path / "done"
    run = subprocess.run(
        argv(tmp_path, "--done-file", str(done), "--hold"),
        env=subprocess_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr  # not held: it exits
    assert modes(tmp_path, gpus)[:3] == ["DEFAULT", "DEFAULT", "EXCLUSIVE_PROCESS"]
    assert (
        f"GPU 2 {gpus[2].uuid}: cannot set the compute mode of {gpus[2].uuid}: "
        "NVML error 4: Insufficient Permissions"
    ) in run.stderr.splitlines()
    assert "1 of 4 GPU(s) not reset" in run.stderr
    assert not done.exists()  # the pod stays not ready


def test_held_it_is_ready_once_reset_and_exits_0_on_sigterm(
    tmp_path: Path, gpus: list[Device]
) -> None:
    write_modes(tmp_path, {g.uuid: EXCLUSIVE for g in gpus})
    done = tmp_path / "done"
    process = subprocess.Popen(
        argv(tmp_path, "--done-file", str(done), "--hold"),
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not done.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.exists(), process.communicate(timeout=5)
        assert modes(tmp_path, gpus) == ["DEFAULT"] * 4  # reset before it says so
        time.sleep(0.3)
        assert process.poll() is None  # held, as a DaemonSet's container must be
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out.count("EXCLUSIVE_PROCESS -> DEFAULT") == 4


def test_an_unreadable_table_of_the_simulated_driver_is_a_configuration_error(
    tmp_path: Path,
) -> None:
    (tmp_path / MODES_FILE).write_text("[1, 2]")
    run = subprocess.run(
        argv(tmp_path), env=subprocess_env(), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert run.returncode == 2 and MODES_FILE in run.stderr, run.stderr


# -- with a real agent on the node ---------------------------------------------------------


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


def stop_agent(agent: subprocess.Popen[bytes]) -> int:
    agent.send_signal(signal.SIGTERM)
    return agent.wait(timeout=30)


# Real agents start and stop here (about 5 s in all): more than a unit test's 5 s limit.
@pytest.mark.timeout(60)
def test_it_waits_for_the_agent_then_holds_its_lock_so_no_agent_starts_again(
    gpus: list[Device],
) -> None:
    """The reset pod's life on a node, with `gpushare serve --sim` as the node's agent: the
    reset waits (and says so) while the agent runs, resets once the agent is stopped, and
    while it is held a new agent waits for the lock, then exits 3 having started nothing;
    once the reset ends an agent starts again."""
    with short_dir() as root:
        write_modes(root, {g.uuid: EXCLUSIVE for g in gpus})  # what the agent left
        agent = spawn_agent(root)
        reset: subprocess.Popen[bytes] | None = None
        log = root / "reset.err"
        try:
            wait_until("the agent serves", (root / "agent.sock").exists)
            done = root / "done"
            with open(log, "wb") as err:
                reset = subprocess.Popen(
                    argv(root, "--done-file", str(done), "--hold", "--wait-agent-s", "30"),
                    env=subprocess_env(), stdout=subprocess.PIPE, stderr=err,
                )  # fmt: skip
            wait_until("it says it waits", lambda: "for the agent to stop" in log.read_text())
            waiting = log.read_text()
            assert (
                f"waiting up to 30 s for the agent to stop: another gpushare agent (pid {agent.pid}"
                in waiting
            )
            time.sleep(0.5)
            assert reset.poll() is None and not done.exists()
            assert modes(root, gpus) == ["EXCLUSIVE_PROCESS"] * 4  # nothing reset meanwhile

            assert stop_agent(agent) == 0
            wait_until("the reset is done", done.exists)
            assert modes(root, gpus) == ["DEFAULT"] * 4
            assert f"the agent stopped: its lock {root}/agent.sock.lock is held" in log.read_text()

            started = time.monotonic()
            second = subprocess.run(
                agent_command(
                    "--socket", str(root / "agent.sock"), "serve", "--sim", "--http-listen", "",
                    "--set", f"paths.runtime_dir={root}", "--set", f"paths.state_dir={root}/state",
                    "--set", "runtime.lock_wait_s=1",
                ),
                env=subprocess_env(), capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            took_s = time.monotonic() - started
            assert second.returncode == 3, second.stderr  # refused: another holds the lock
            assert (
                f"pid {reset.pid}" in second.stderr and "already uses the socket" in second.stderr
            )
            assert took_s >= 1.0  # it waited its runtime.lock_wait_s first
            assert not (root / "agent.sock").exists()  # it served nothing
            assert reset.poll() is None  # still held

            reset.send_signal(signal.SIGTERM)
            out, _ = reset.communicate(timeout=10)
            assert reset.returncode == 0
            assert out.decode().count("EXCLUSIVE_PROCESS -> DEFAULT (read back)") == 4
            agent = spawn_agent(root)  # the lock is free again: an agent starts
            wait_until("an agent serves again", (root / "agent.sock").exists)
            assert stop_agent(agent) == 0
        finally:
            for process in (agent, reset):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.communicate(timeout=10)


@pytest.mark.timeout(60)
def test_without_a_wait_a_running_agent_is_refused_at_once_and_nothing_is_reset(
    gpus: list[Device],
) -> None:
    with short_dir() as root:
        write_modes(root, {gpus[0].uuid: EXCLUSIVE})
        agent = spawn_agent(root)
        try:
            wait_until("the agent serves", (root / "agent.sock").exists)
            run = subprocess.run(
                argv(root), env=subprocess_env(), capture_output=True, text=True, timeout=60,
                check=False,
            )  # fmt: skip
        finally:
            code = stop_agent(agent)
        left = modes(root, gpus)
    assert code == 0
    assert run.returncode == 3, run.stdout + run.stderr
    assert "the agent still runs after 0 s, so no GPU was reset" in run.stderr
    assert f"pid {agent.pid}" in run.stderr and run.stdout == ""
    assert left[0] == "EXCLUSIVE_PROCESS"
