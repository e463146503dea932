"""The users of the fake MPS control daemon (:mod:`agent.mps.fake_daemon`): its servers per
UID, their clients, the clients that wait, and what each client holds in device memory.

**One server at a time.** A legacy daemon starts a server with its first client's UID; a
client of another UID is pushed to the pending list (``NEW CLIENT <pid> from user <uid>:
Server is not ready, push client to pending list``) and the running server is asked to exit
once its clients are done: clients of different UIDs never run at once. When its last
client leaves, the server exits (``Server <pid> exited with status 0``; 1 after a fatal
fault) and the server of the first waiting UID starts (``Starting new server <pid> for user
<uid>``, ``NEW SERVER <pid>: Ready``) with every waiting client of that UID connected.

What the daemon does with a new client of the UID whose server was asked to exit, the
reference does not say. The fake takes the conservative reading: a server asked to exit
takes no new client; the client waits in the pending list, in arrival order, behind the
UIDs queued before it (no UID can starve the others), and gets a fresh server of its UID
in its turn. A waiting client that goes away leaves the list; the request to exit stands
(no way to take it back is documented). A faulted server refuses new clients of its UID
(``refused: ...``) and, like any server asked to exit, lets another UID's clients wait for
it. ``start_server`` and ``shutdown_server`` act at once, as before.

**Multi-user mode** (``-M``; newer daemons, not the 535 binary): servers of several UIDs
run at once and no client waits.

**Memory per client process.** The pinned-memory limit applies to each client process on
its own (reference: "the limit applies per client process"): a client binds its server's
limit for device 0 when it connects, and ``fake_client_memory PID MIB`` gives it an
allocation up to that limit whatever the other clients hold, so the four processes of one
container can hold four times the limit. The allocations are published (the hook behind
:data:`CLIENT_MEMORY_FILE`) for the simulated node's process lists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

CLIENT_MEMORY_FILE = "fake_client_memory"  # in the pipe directory: "PID MIB" lines
PENDING = "pending\n"
REFUSED_FAULT = "refused: server is recovering from a fault\n"


@dataclass
class FakeServer:
    pid: int
    uid: int
    thread_pct: float
    memory_limits_mib: dict[int, int]
    clients: list[int] = field(default_factory=list)
    faulted: bool = False
    exiting: bool = False  # asked to exit once its clients are done: takes no new client


@dataclass
class ClientMemory:
    """A client's pinned-memory limit on device 0, bound when it connected, and what it
    holds (None: never said)."""

    limit_mib: int | None
    used_mib: int | None = None


@dataclass(frozen=True)
class UserHooks:
    """What the users' model needs from its daemon."""

    start_server: Callable[[], int]  # a new server process; its PID
    stop_server: Callable[[int], None]
    log: Callable[[str], None]  # a control.log text
    server_log: Callable[[int, str], None]  # a server.log text of that server
    defaults: Callable[[], tuple[float, dict[int, int]]]  # thread %, limits for a new server
    client_memory: Callable[[dict[int, int]], None]  # each client's allocation, MiB


def render_client_memory(used: Mapping[int, int]) -> str:
    return "".join(f"{pid} {mib}\n" for pid, mib in used.items())


def parse_client_memory(text: str) -> dict[int, int]:
    """``PID MIB`` lines; anything else is skipped."""
    table: dict[int, int] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and all(w.isdigit() for w in words):
            table[int(words[0])] = int(words[1])
    return table


class FakeUsers:
    """Servers per UID, clients, the pending list and the clients' memory."""

    def __init__(self, hooks: UserHooks, *, multi_user: bool = False) -> None:
        self.hooks = hooks
        self.multi_user = multi_user
        self.servers: dict[int, FakeServer] = {}
        self.pending: list[tuple[int, int]] = []  # (client, uid), in arrival order
        self.memory: dict[int, ClientMemory] = {}
        self._published: dict[int, int] = {}

    # -- clients -----------------------------------------------------------------------------

    def connect(self, client: int, uid: int) -> str:
        """A CUDA client of ``uid`` connects: its server's PID, ``pending`` or ``refused``."""
        own = next((s for s in self.servers.values() if s.uid == uid), None)
        if own is not None and own.faulted:
            self._log_pending(client, uid)
            return REFUSED_FAULT
        if self._must_wait(own, uid):
            self._log_pending(client, uid)
            self.pending.append((client, uid))
            self._ask_to_exit(but=uid)
            self._advance()
            server = self.server_of_client(client)
            return PENDING if server is None else f"{server.pid}\n"
        suffix = ": Server already exists" if own else ""
        self.hooks.log(f"NEW CLIENT {client} from user {uid}{suffix}")
        server = own or self.new_server(uid)
        self._attach(server, client)
        return f"{server.pid}\n"

    def disconnect(self, client: int) -> str:
        """A client goes away, connected or still waiting."""
        waiting = [p for p in self.pending if p[0] == client]
        if waiting:
            self.pending.remove(waiting[0])
            return ""
        server = self.server_of_client(client)
        if server is None:
            return f"Client {client} not found\n"
        self.drop_client(server, client)
        return ""

    def drop_client(self, server: FakeServer, client: int) -> None:
        """The client leaves its server (disconnected or terminated); a server that must go
        goes with its last client, and the next waiting UID gets its turn."""
        server.clients.remove(client)
        self.memory.pop(client, None)
        self._publish()
        self.hooks.server_log(server.pid, f"Client {client} disconnected")
        if server.faulted and not server.clients:
            self.end_server(server, status=1)
        self._advance()

    def pending_text(self) -> str:
        """The waiting clients, ``PID UID`` a line, in the order they will be served."""
        return "".join(f"{client} {uid}\n" for client, uid in self.pending)

    def server_of_client(self, client: int) -> FakeServer | None:
        return next((s for s in self.servers.values() if client in s.clients), None)

    # -- memory ------------------------------------------------------------------------------

    def client_memory(self, client: int, mib: int | None) -> str:
        """Set what a connected client holds (``mib``), or say it (None)."""
        held = self.memory.get(client) if self.server_of_client(client) else None
        if held is None:
            return f"Client {client} not found\n"
        if mib is None:
            return f"{held.used_mib or 0}\n"
        if held.limit_mib is not None and mib > held.limit_mib:
            return (
                f"refused: {mib}M is over the client's pinned memory limit of {held.limit_mib}M\n"
            )
        held.used_mib = mib
        self._publish()
        return ""

    def _publish(self) -> None:
        used = {pid: m.used_mib for pid, m in self.memory.items() if m.used_mib is not None}
        if used != self._published:
            self._published = used
            self.hooks.client_memory(dict(used))

    # -- servers -----------------------------------------------------------------------------

    def new_server(self, uid: int) -> FakeServer:
        pid = self.hooks.start_server()
        self.hooks.log(f"Starting new server {pid} for user {uid}")
        thread_pct, limits = self.hooks.defaults()
        server = FakeServer(pid, uid, thread_pct, limits)
        self.servers[pid] = server
        self.hooks.server_log(pid, f"Active Threads Percentage set to {thread_pct:.1f}")
        self.hooks.log(f"NEW SERVER {pid}: Ready")
        return server

    def fault(self, server: FakeServer) -> None:
        """A fatal exception: the server refuses new clients and exits with its last one."""
        server.faulted = True
        self.hooks.server_log(server.pid, "Server encountered a fatal exception")
        self.hooks.log("Server encountered a fatal exception. Shutting down")
        if not server.clients:
            self.end_server(server, status=1)
        self._advance()

    def shutdown(self, server: FakeServer) -> None:
        """``shutdown_server``: the server ends now; the next waiting UID gets its turn."""
        self.end_server(server, status=0)
        self._advance()

    def end_server(self, server: FakeServer, *, status: int) -> None:
        self.servers.pop(server.pid, None)
        for client in server.clients:
            self.memory.pop(client, None)
        self._publish()
        self.hooks.stop_server(server.pid)
        self.hooks.log(f"Server {server.pid} exited with status {status}")

    def stop_all(self) -> None:
        self.pending.clear()
        for server in list(self.servers.values()):
            self.end_server(server, status=0)

    # -- inside ------------------------------------------------------------------------------

    def _must_wait(self, own: FakeServer | None, uid: int) -> bool:
        if self.multi_user:
            return False
        if own is not None:
            return own.exiting
        return bool(self.pending) or any(s.uid != uid for s in self.servers.values())

    def _log_pending(self, client: int, uid: int) -> None:
        self.hooks.log(
            f"NEW CLIENT {client} from user {uid}: Server is not ready, push client to pending list"
        )

    def _ask_to_exit(self, *, but: int) -> None:
        """Servers of every UID other than ``but`` exit once their clients are done."""
        for server in self.servers.values():
            if server.uid != but:
                server.exiting = True

    def _advance(self) -> None:
        """End the servers asked to exit that have no client left; with none running, start
        the server of the first waiting UID and connect all its waiting clients."""
        for server in [s for s in self.servers.values() if s.exiting and not s.clients]:
            self.end_server(server, status=1 if server.faulted else 0)
        if self.servers or not self.pending:
            return
        uid = self.pending[0][1]
        waiting = [client for client, u in self.pending if u == uid]
        self.pending = [p for p in self.pending if p[1] != uid]
        server = self.new_server(uid)
        for client in waiting:
            self._attach(server, client)
        if self.pending:
            self._ask_to_exit(but=self.pending[0][1])

    def _attach(self, server: FakeServer, client: int) -> None:
        server.clients.append(client)
        self.memory[client] = ClientMemory(server.memory_limits_mib.get(0))
        self.hooks.server_log(server.pid, f"New client {client} connected")
