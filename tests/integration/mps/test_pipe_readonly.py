"""What a read-only bind mount of a device's pipe directory (as client containers get it)
allows, against the real nvidia-cuda-mps-control: connect(2) to ``control`` and writing
to the ``log`` FIFO work (so clients and the front-end reach the daemon, and can still
change its defaults or, as root, quit it), while creating, removing, renaming or chmod-ing
an entry fails with EROFS: a tenant cannot plant a socket of its own for the next tenant's
clients, remove the daemon's, or open up its modes. Run in a mount namespace of its own
(root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import short_dir
from tests.integration.mps.harness import REAL_BINARY

pytestmark = [
    pytest.mark.mps_binary,
    pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root"),
]

# Runs in a child: its own mount namespace, the pipe directory bound read-only on VIEW.
CLIENT = r"""
import errno, json, os, socket, subprocess, sys
from agent.mps import shmexec
pipe, view, binary = sys.argv[1:4]
shmexec.unshare_mounts()
shmexec.mount(pipe, view, None, shmexec.MS_BIND)
shmexec.mount(None, view, None, shmexec.MS_REMOUNT | shmexec.MS_BIND | 0x1)  # MS_RDONLY
env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": view}
def ask(command):
    done = subprocess.run([binary], input=command + "\n", capture_output=True, text=True,
                          env=env, timeout=10)
    return (done.stdout + done.stderr).strip()
found = {"get": ask("get_default_active_thread_percentage"),
         "set": ask("set_default_active_thread_percentage 20")}
def attempt(name, action):
    try:
        action()
        found[name] = "ok"
    except OSError as exc:
        found[name] = errno.errorcode[exc.errno]
attempt("fifo", lambda: os.close(os.open(f"{view}/log", os.O_WRONLY | os.O_NONBLOCK)))
attempt("create", lambda: open(f"{view}/planted", "w").close())
attempt("unlink", lambda: os.unlink(f"{view}/control"))
attempt("rename", lambda: os.rename(f"{view}/control", f"{view}/moved"))
attempt("chmod", lambda: os.chmod(f"{view}/control_privileged", 0o777))
attempt("bind", lambda: socket.socket(socket.AF_UNIX).bind(f"{view}/control.new"))
print(json.dumps(found))
"""


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def test_a_read_only_pipe_directory_still_reaches_the_daemon_and_nothing_in_it_changes(
    root: Path,
) -> None:
    assert REAL_BINARY
    pipe, logs, view = root / "pipe", root / "log", root / "view"
    for directory in (pipe, logs, view):
        directory.mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    subprocess.run([REAL_BINARY, "-d"], env=env, check=True, timeout=10)
    try:
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, str(pipe), str(view), REAL_BINARY],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        found = json.loads(done.stdout)
        assert found["get"] == "100.0"
        assert found["set"] == "20.0", "a read-only directory does not protect the defaults"
        assert found["fifo"] == "ok"
        for change in ("create", "unlink", "rename", "chmod", "bind"):
            assert found[change] == "EROFS", (change, found)
        assert sorted(os.listdir(pipe)) == ["control", "control_lock", "control_privileged", "log"]
    finally:
        subprocess.run([REAL_BINARY], input="quit\n", text=True, env=env, timeout=10, check=False)
