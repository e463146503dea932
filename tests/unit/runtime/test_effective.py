"""The running agent's published settings are shown only while that agent holds the socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agent.runtime import effective
from agent.runtime.lock import InstanceLock
from tests.helpers import sim_settings


def publish(tmp_path: Path) -> str:
    settings = sim_settings(tmp_path, **{"runtime.node_name": "worker-7"})
    Path(settings.unix_socket_path).parent.mkdir(parents=True)  # the agent makes it first
    effective.publish(settings)
    return settings.unix_socket_path


def test_the_holder_of_the_lock_is_the_running_agent(tmp_path: Path) -> None:
    socket = publish(tmp_path)
    lock = InstanceLock(socket)
    lock.acquire()
    try:
        record = effective.running(socket)
        assert record is not None and record["pid"] == os.getpid()
        assert record["settings"]["runtime"]["node_name"] == "worker-7"
        assert effective.settings_of(record).runtime.node_name == "worker-7"
    finally:
        lock.release()
    assert oct(Path(effective.record_path(socket)).stat().st_mode & 0o777) == "0o600"


def test_a_record_left_by_a_dead_agent_is_not_shown_as_running(tmp_path: Path) -> None:
    socket = publish(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(gone.stdout)
    path = Path(effective.record_path(socket))
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": dead}))
    Path(f"{socket}.lock").write_text(f"{dead} {socket}\n")
    assert effective.running(socket) is None
    assert effective.last(socket) is not None  # still there for `mps status --direct`


def test_a_reused_pid_is_not_the_agent_that_published(tmp_path: Path) -> None:
    socket = publish(tmp_path)
    path = Path(effective.record_path(socket))
    older = {**json.loads(path.read_text()), "started_at": 1_000_000.0}  # before this process
    path.write_text(json.dumps(older))
    Path(f"{socket}.lock").write_text(f"{os.getpid()} {socket}\n")
    assert effective.running(socket) is None


def test_another_agents_lock_or_no_record_is_no_running_agent(tmp_path: Path) -> None:
    socket = publish(tmp_path)
    Path(f"{socket}.lock").write_text(f"1 {socket}\n")  # held by someone else
    assert effective.running(socket) is None
    assert effective.running(str(tmp_path / "other.sock")) is None
    Path(effective.record_path(socket)).write_text("{half a rec")
    assert effective.running(socket) is None and effective.last(socket) is None
