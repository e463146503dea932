"""``gpushare-fake-mps-control``: a drop-in stand-in for ``nvidia-cuda-mps-control``.

Same invocation and stdin protocol as the real front-end: ``-d`` starts a background
daemon (log in ``$CUDA_MPS_LOG_DIRECTORY/control.log``), ``-f`` a foreground daemon (log on
stdout), and without either it is the front-end: it sends stdin to the daemon of
``$CUDA_MPS_PIPE_DIRECTORY`` and prints the answer. Like the 535 daemon it holds a POSIX
lock on ``control_lock``, leaves its sockets behind when it quits, serves one UI connection
at a time (others get an empty answer), and starts one server process per UID (here a
``sleep`` process, so server PIDs are real). Used by the simulated node when the real binary
is absent, and by the tests. With ``GPUSHARE_FAKE_MPS_SHM=1`` in its environment each
stand-in server also creates its region ``mps.shm.<uid>.<pid>`` in the ``/dev/shm`` it sees,
as a real server does, and the daemon removes it when the server ends (the 535 daemon
logs ``Removed Shm file at``): what shows which /dev/shm a daemon's servers have.

Like the legacy daemon it runs one server at a time: a client of another UID waits until
the running server's clients are done (:mod:`agent.mps.fake_users`). ``-M`` starts it in
the multi-user mode of newer daemons (servers of several UIDs at once; the 535 binary has
no such mode), and ``-h`` lists it, which is what the agent checks before it passes ``-M``.
What its clients hold (``fake_client_memory``) it keeps in ``fake_client_memory`` in the
pipe directory, ``PID MIB`` a line, where the simulated node's process lists read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent.mps.fake_daemon import FakeMpsState
from agent.mps.fake_users import CLIENT_MEMORY_FILE, render_client_memory

RUNNING = "An instance of this daemon is already running"


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    logs = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    return pipe, logs


# util-linux's setpriv sets the child's parent-death signal before it runs sleep: the kernel
# kills the stand-in server when its daemon dies
SERVER = ["setpriv", "--pdeathsig", "KILL", "--", "sleep", "infinity"]
SHM_ENV = "GPUSHARE_FAKE_MPS_SHM"
# the stand-in server makes its region in the /dev/shm it sees, then waits
SHM_SERVER = 'touch "/dev/shm/mps.shm.$(id -u).$$" && exec sleep infinity'


class FakeDaemon:
    def __init__(self, pipe: Path, logs: Path, *, multi_user: bool = False) -> None:
        self.pipe, self.logs = pipe, logs
        self.busy = False
        self.hung = False
        self.done = asyncio.Event()
        self.servers: dict[int, subprocess.Popen[bytes]] = {}
        self.state = FakeMpsState(
            daemon_pid=os.getpid(),
            start_server=self._spawn_server,
            stop_server=self._kill_server,
            control_log=self._control_log,
            server_log=self._server_log,
            multi_user=multi_user,
            client_memory=self._publish_memory,
        )

    def _control_log(self, line: str) -> None:
        print(line, flush=True)

    def _server_log(self, line: str) -> None:
        with contextlib.suppress(OSError), open(self.logs / "server.log", "a") as f:
            f.write(line + "\n")

    def _publish_memory(self, used: dict[int, int]) -> None:
        """What each client holds, for the simulated node's process lists; replaced whole
        (written beside, then renamed) so that a reader never sees half of it."""
        scratch = self.pipe / f".{CLIENT_MEMORY_FILE}.new"
        with contextlib.suppress(OSError):
            scratch.write_text(render_client_memory(used))
            os.replace(scratch, self.pipe / CLIENT_MEMORY_FILE)

    def _spawn_server(self) -> int:
        """A stand-in server process that dies with this daemon, however it ends (SIGKILL
        included), as a real MPS server goes with its control daemon."""
        command = SERVER if shutil.which("setpriv") else SERVER[4:]
        if os.environ.get(SHM_ENV) == "1":
            command = [*command[: command.index("sleep")], "sh", "-c", SHM_SERVER]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        self.servers[process.pid] = process
        return process.pid

    def _kill_server(self, pid: int) -> None:
        process = self.servers.pop(pid, None)
        if process is not None:
            process.kill()
            process.wait()
        regions = Path("/dev/shm").glob(f"mps.shm.*.{pid}") if os.environ.get(SHM_ENV) else ()
        for region in regions:
            region.unlink(missing_ok=True)
            self.state.log(f"Removed Shm file at {region}")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.busy or self.hung:
            if self.hung:
                await asyncio.Event().wait()  # never answer, like a stopped daemon
            writer.close()  # one UI at a time: the other gets nothing
            return
        self.busy = True
        try:
            await self._serve(reader, writer)
        finally:
            self.busy = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.state.log("Accepting connection...")
        self.state.log("NEW UI")
        request = (await reader.read()).decode(errors="replace")
        answers = []
        for line in request.splitlines() or [""]:
            self.state.log(f"Cmd:{line}")
            answer = self.state.handle(line)
            for out in answer.text.splitlines():
                self.state.log(out)
            answers.append(answer.text)
            if answer.hang:
                self.hung = True
                await asyncio.Event().wait()
            if answer.quit:
                self.state.log("quit command issued with timeout of 5")
                self.done.set()
        writer.write("".join(answers).encode())
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
        self.state.log("UI closed")

    async def serve(self) -> int:
        control = self.pipe / "control"
        with contextlib.suppress(FileNotFoundError):
            control.unlink()
        (self.pipe / CLIENT_MEMORY_FILE).unlink(missing_ok=True)  # an earlier daemon's clients
        server = await asyncio.start_unix_server(self.handle, path=str(control))
        os.chmod(control, 0o666)
        (self.pipe / "control_privileged").touch(mode=0o755)
        self.state.log(f"Starting control daemon using socket {control}")
        self.state.log(
            f"To connect CUDA applications to this daemon, set env "
            f"CUDA_MPS_PIPE_DIRECTORY={self.pipe}"
        )
        async with server:
            await self.done.wait()
        self.state.stop_all()
        (self.pipe / CLIENT_MEMORY_FILE).unlink(missing_ok=True)
        self.state.log("Exit with status 0")
        return 0


def daemon(foreground: bool, *, multi_user: bool = False) -> int:
    pipe, logs = _dirs()
    pipe.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(pipe / "control_lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.lockf(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(RUNNING)
        return 1
    if not foreground:
        os.close(lock_fd)
        return _background(logs, multi_user=multi_user)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return asyncio.run(FakeDaemon(pipe, logs, multi_user=multi_user).serve())


def _background(logs: Path, *, multi_user: bool) -> int:
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "control.log", "a") as log:
        subprocess.Popen(
            [sys.executable, "-m", "agent.mps.fakectl", "-f", *(["-M"] if multi_user else [])],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pipe, _ = _dirs()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (pipe / "control").exists():
        time.sleep(0.02)
    return 0
