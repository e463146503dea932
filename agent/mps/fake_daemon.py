"""The state and answers of a fake MPS control daemon, in the 535 front-end's formats.

Used by ``agent.mps.fakebin`` (a drop-in ``nvidia-cuda-mps-control`` executable) so that
the agent's real adapter can be exercised on paths the real binary cannot show without a
GPU: servers per UID, clients, per-server limits, ``terminate_client``, a fatal fault.
Answers and log lines are those recorded from the 535 binary; where none could be recorded
(a successful ``terminate_client``, the ``ps`` rows) they follow the binary's format
strings, and this is said where it happens.

Besides the real commands it accepts a few ``fake_*`` commands that stand in for what a
GPU would do: ``fake_connect_client PID UID``, ``fake_disconnect_client PID``,
``fake_fault SERVER_PID`` and ``fake_hang``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

MIB = 1024 * 1024
MAX_ORDINAL = 31


@dataclass
class FakeServer:
    pid: int
    uid: int
    thread_pct: float
    memory_limits_mib: dict[int, int]
    clients: list[int] = field(default_factory=list)
    faulted: bool = False


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
    ) -> None:
        self.daemon_pid = daemon_pid
        self.default_thread_pct = 100.0
        self.default_limits_mib: dict[int, int] = {}
        self.default_priority = 0
        self.servers: dict[int, FakeServer] = {}
        self._start_server = start_server
        self._stop_server = stop_server
        self._control_log = control_log
        self._server_log = server_log

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
            "fake_fault": self._fault,
            "fake_hang": lambda _a: Answer(hang=True),
        }

    # -- lookups ---------------------------------------------------------------------------

    def _server(self, args: list[str]) -> tuple[int, FakeServer | None]:
        pid = _number(args[0]) if args else 0
        return pid, self.servers.get(pid)

    def _server_of_client(self, client: int) -> FakeServer | None:
        return next((s for s in self.servers.values() if client in s.clients), None)

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
        self._new_server(_number(args[1]))
        return Answer()

    def _shutdown(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        if server is None:
            return Answer(f"Server {pid} not found\n")
        self._end_server(server, status=0)
        return Answer()

    def _terminate(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        client = _number(args[1]) if len(args) > 1 else 0
        if server is None or client not in server.clients:
            return Answer(f"Server {pid} not found\nServer {pid} not found!\n1\n")
        # Success output was not observable without a GPU; "0" mirrors the failure's "1".
        self._drop_client(server, client, reason="terminated")
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
        server = next((s for s in self.servers.values() if s.uid == uid), None)
        if server is not None and server.faulted:
            self.log(
                f"NEW CLIENT {client} from user {uid}: Server is not ready, "
                "push client to pending list"
            )
            return Answer("refused: server is recovering from a fault\n")
        self.log(
            f"NEW CLIENT {client} from user {uid}" + (": Server already exists" if server else "")
        )
        if server is None:
            server = self._new_server(uid)
        server.clients.append(client)
        self._server_log(log_line("Server", server.pid, f"New client {client} connected"))
        return Answer(f"{server.pid}\n")

    def _disconnect(self, args: list[str]) -> Answer:
        client = _number(args[0]) if args else 0
        server = self._server_of_client(client)
        if server is None:
            return Answer(f"Client {client} not found\n")
        self._drop_client(server, client, reason="disconnected")
        return Answer()

    def _fault(self, args: list[str]) -> Answer:
        pid, server = self._server(args)
        if server is None:
            return Answer(f"Server {pid} not found\n")
        server.faulted = True
        self._server_log(log_line("Server", server.pid, "Server encountered a fatal exception"))
        self.log("Server encountered a fatal exception. Shutting down")
        if not server.clients:
            self._end_server(server, status=1)
        return Answer()

    # -- servers and clients ---------------------------------------------------------------

    def _new_server(self, uid: int) -> FakeServer:
        pid = self._start_server()
        self.log(f"Starting new server {pid} for user {uid}")
        server = FakeServer(pid, uid, self.default_thread_pct, dict(self.default_limits_mib))
        self.servers[pid] = server
        self._server_log(
            log_line("Server", pid, f"Active Threads Percentage set to {server.thread_pct:.1f}")
        )
        self.log(f"NEW SERVER {pid}: Ready")
        return server

    def _drop_client(self, server: FakeServer, client: int, *, reason: str) -> None:
        server.clients.remove(client)
        self._server_log(log_line("Server", server.pid, f"Client {client} disconnected"))
        if server.faulted and not server.clients:
            self._end_server(server, status=1)

    def _end_server(self, server: FakeServer, *, status: int) -> None:
        self.servers.pop(server.pid, None)
        self._stop_server(server.pid)
        self.log(f"Server {server.pid} exited with status {status}")

    def stop_all(self) -> None:
        for server in list(self.servers.values()):
            self._end_server(server, status=0)


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
