"""The state and answers of a fake MPS control daemon, in the 535 front-end's formats.

Used by ``agent.mps.fakebin`` (a drop-in ``nvidia-cuda-mps-control`` executable) so that
the agent's real adapter can be exercised on paths the real binary cannot show without a
GPU: servers per UID, clients, per-server limits, ``terminate_client``, a fatal fault.
Answers and log lines are those recorded from the 535 binary; where none could be recorded
(a successful ``terminate_client``, the ``ps`` rows) they follow the binary's format
strings, and this is said where it happens.

Besides the real commands it accepts a few ``fake_*`` commands that stand in for what a
GPU would do:

- ``fake_connect_client PID UID``: a CUDA client connects. Answers its server's PID;
  ``pending`` when it waits for the server of another UID to exit (one server at a time,
  unless the daemon runs in multi-user mode); ``refused: ...`` while its UID's server
  recovers from a fatal fault.
- ``fake_disconnect_client PID``: the client goes away, connected or waiting.
- ``fake_pending``: the waiting clients, ``PID UID`` a line, in the order they are served.
- ``fake_client_memory PID [MIB]``: what a connected client holds in device memory (MiB),
  up to the pinned-memory limit it bound when it connected (the limit applies per client
  process); without ``MIB`` it says what the client holds.
- ``fake_fault SERVER_PID``: a fatal exception in that server.
- ``fake_hang``: the daemon stops answering anyone.

How users, waiting clients and memory behave is in :mod:`agent.mps.fake_users`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.mps.fake_users import FakeServer, FakeUsers, UserHooks

__all__ = ["Answer", "FakeMpsState", "FakeServer", "log_line"]

MIB = 1024 * 1024
MAX_ORDINAL = 31


@dataclass
class Answer:
    text: str = ""
    quit: bool = False
    hang: bool = False


def log_line(role: str, pid: int, text: str, *, now: float | None = None) -> str:
    stamp = time.time() if now is None else now
    millis = int(stamp * 1000) % 1000
    clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    return f"[{clock}.{millis:03d} {role} {pid:5d}] {text}"


class FakeMpsState:
    def __init__(
        self,
        *,
        daemon_pid: int,
        start_server: Callable[[], int],
        stop_server: Callable[[int], None],
        control_log: Callable[[str], None],
        server_log: Callable[[str], None],
        multi_user: bool = False,
        client_memory: Callable[[dict[int, int]], None] = lambda _used: None,
    ) -> None:
        self.daemon_pid = daemon_pid
        self.default_thread_pct = 100.0
        self.default_limits_mib: dict[int, int] = {}
        self.default_priority = 0
        self._control_log = control_log
        self.users = FakeUsers(
            UserHooks(
                start_server=start_server,
                stop_server=stop_server,
                log=self.log,
                server_log=lambda pid, text: server_log(log_line("Server", pid, text)),
                defaults=lambda: (self.default_thread_pct, dict(self.default_limits_mib)),
                client_memory=client_memory,
            ),
            multi_user=multi_user,
        )
        self.servers = self.users.servers  # the same dict, PID -> server

    def log(self, text: str) -> None:
        self._control_log(log_line("Control", self.daemon_pid, text))

    def handle(self, raw: str) -> Answer:
        line = raw.strip()
        words = line.split()
        name, args = (words[0], words[1:]) if words else ("", [])
        handler = self._handlers().get(name)
        if handler is None:
            return Answer(f'Unknown command "{name}"\n')  # the daemon quotes the first word
        return handler(args)

    def _handlers(self) -> dict[str, Callable[[list[str]], Answer]]:
        return {
            "get_server_list": lambda _a: Answer("".join(f"{p}\n" for p in self.servers)),
            "get_client_list": self._get_client_list,
            "get_default_active_thread_percentage": lambda _a: Answer(
                f"{self.default_thread_pct:.1f}\n"
            ),
            "set_default_active_thread_percentage": self._set_default_pct,
            "get_active_thread_percentage": self._get_server_pct,
            "set_active_thread_percentage": self._set_server_pct,
            "get_default_device_pinned_mem_limit": self._get_default_limit,
            "set_default_device_pinned_mem_limit": self._set_default_limit,
            "get_device_pinned_mem_limit": self._get_server_limit,
            "set_device_pinned_mem_limit": self._set_server_limit,
            "get_default_client_priority": lambda _a: Answer(f"{self.default_priority}\n"),
            "set_default_client_priority": self._set_priority,
            "start_server": self._start,
            "shutdown_server": self._shutdown,
            "terminate_client": self._terminate,
            "ps": self._ps,
            "quit": lambda _a: Answer(quit=True),
            "fake_connect_client": self._connect,
            "fake_disconnect_client": self._disconnect,
            "fake_pending": lambda _a: Answer(self.users.pending_text()),
            "fake_client_memory": self._client_memory,
            "fake_fault": self._fault,
            "fake_hang": lambda _a: Answer(hang=True),
        }

    # -- lookups ---------------------------------------------------------------------------

    def _server(self, args: list[str]) -> tuple[int, FakeServer | None]:
        pid = _number(args[0]) if args else 0
        return pid, self.servers.get(pid)

    # -- real commands ---------------------------------------------------------------------

    def _get_client_list(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        if server is None:
            return Answer(f"Server {pid} not found\n")
        return Answer("".join(f"{c}\n" for c in server.clients))

    def _set_default_pct(self, args: list[str]) -> Answer:
        value = _percentage(args[0]) if args else None
        if value is None:
            self.log("Invalid percentage, expected between (0.0, 100.0]")
        else:
            self.default_thread_pct = value
        return Answer(f"{self.default_thread_pct:.1f}\n")

    def _get_server_pct(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        if server is None:
            return Answer(f"Server {pid} not found\n")
        return Answer(f"{server.thread_pct:.1f}\n")

    def _set_server_pct(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        if server is None:
            return Answer(f"Server {pid} not found\n")
        value = _percentage(args[1]) if len(args) > 1 else None
        if value is None:
            self.log("Invalid percentage, expected between (0.0, 100.0]")
        else:
            server.thread_pct = value
        return Answer(f"{server.thread_pct:.1f}\n")

    def _get_default_limit(self, args: list[str]) -> Answer:
        ordinal = _number(args[0]) if args else 0
        if ordinal not in self.default_limits_mib:
            self.log("No default pinned memory limit set for the device!")
            return Answer()
        return Answer(_render_mib(self.default_limits_mib[ordinal]) + "\n")

    def _set_default_limit(self, args: list[str]) -> Answer:
        ordinal = _number(args[0]) if args else 0
        if ordinal > MAX_ORDINAL:
            self.log("Invalid device ordinal!")
            return Answer()
        _store(self.default_limits_mib, ordinal, _parse_535_limit(args[1] if len(args) > 1 else ""))
        return Answer()

    def _get_server_limit(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        if server is None:
            return Answer(f"Server {pid} not found\n")
        ordinal = _number(args[1]) if len(args) > 1 else 0
        value = server.memory_limits_mib.get(ordinal)
        return Answer("" if value is None else _render_mib(value) + "\n")

    def _set_server_limit(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        if server is None:
            return Answer(f"Server {pid} not found\n")
        ordinal = _number(args[1]) if len(args) > 1 else 0
        if ordinal > MAX_ORDINAL:
            self.log("Invalid device ordinal!")
            return Answer()
        _store(
            server.memory_limits_mib, ordinal, _parse_535_limit(args[2] if len(args) > 2 else "")
        )
        return Answer()

    def _set_priority(self, args: list[str]) -> Answer:
        if not args or args[0] not in ("0", "1"):
            return Answer("Invalid priority value - must be 0 or 1!\n")
        self.default_priority = int(args[0])
        return Answer()

    def _start(self, args: list[str]) -> Answer:
        if len(args) < 2 or args[0] != "-uid":
            return Answer("A user id (UID) is required to start a new server\n")
        self.users.new_server(_number(args[1]))
        return Answer()

    def _shutdown(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        if server is None:
            return Answer(f"Server {pid} not found\n")
        self.users.shutdown(server)
        return Answer()

    def _terminate(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        client = _number(args[1]) if len(args) > 1 else 0
        if server is None or client not in server.clients:
            return Answer(f"Server {pid} not found\nServer {pid} not found!\n1\n")
        # Success output was not observable without a GPU; "0" mirrors the failure's "1".
        self.users.drop_client(server, client)
        return Answer("0\n")

    def _ps(self, args: list[str]) -> Answer:
        if args[:1] == ["-p"]:
            pid = _number(args[1]) if len(args) > 1 else 0
            if pid not in self.servers:
                return Answer(f"Server {pid} not found\nServer {pid} not found\n\n")
        if not self.servers:
            return Answer("Server not found\n")
        rows = [
            f"{'PID':<10}{'ID':<10}{'SERVER':<15}{'DEVICE':<44}{'NAMESPACE':<15}{'COMMAND':<15}"
        ]
        for server in self.servers.values():
            for context, client in enumerate(server.clients):
                rows.append(
                    f"{client:<10d}{context:<10d}{server.pid:<15d}"
                    f"{'GPU-00000000-0000-0000-0000-000000000000':<44}"
                    f"{'4026531836':<15}{'fake-client':<15}"
                )
        return Answer("\n".join(rows) + "\n")

    # -- what a GPU would do ---------------------------------------------------------------

    def _connect(self, args: list[str]) -> Answer:
        client, uid = (_number(args[0]), _number(args[1])) if len(args) > 1 else (0, 0)
        return Answer(self.users.connect(client, uid))

    def _disconnect(self, args: list[str]) -> Answer:
        return Answer(self.users.disconnect(_number(args[0]) if args else 0))

    def _client_memory(self, args: list[str]) -> Answer:
        client = _number(args[0]) if args else 0
        mib = _number(args[1]) if len(args) > 1 else None
        return Answer(self.users.client_memory(client, mib))

    def _fault(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        if server is None:
            return Answer(f"Server {pid} not found\n")
        self.users.fault(server)
        return Answer()

    def stop_all(self) -> None:
        self.users.stop_all()


def _number(text: str) -> int:
    """Like the daemon: a non-numeric argument reads as 0."""
    digits = ""
    for ch in text.lstrip("+"):
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else 0


def _percentage(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 < value <= 100.0 else None


def _parse_535_limit(text: str) -> int:
    """The 535 reading of a limit, quirks included: MiB unless the suffix is G, no fractions,
    negatives wrapped around 2**64 bytes."""
    negative = text.startswith("-")
    body = text[1:] if negative else text
    digits = ""
    for ch in body:
        if not ch.isdigit():
            break
        digits += ch
    number = int(digits) if digits else 0
    suffix = body[len(digits) : len(digits) + 1]
    mib = number * 1024 if suffix in ("G", "g") else number
    if negative:
        mib = ((2**64) - mib * MIB) // MIB
    return mib


def _store(limits: dict[int, int], ordinal: int, mib: int) -> None:
    if mib == 0:
        limits.pop(ordinal, None)
    else:
        limits[ordinal] = mib


def _render_mib(mib: int) -> str:
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"
