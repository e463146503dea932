"""`gpushare serve --sim` as a real process with TLS and a token: SIGHUP rotates the token
without dropping an open WatchEvents stream, and nothing it creates is open to others."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.client import tls_credentials
from agent.legacy.cluster.service import ClusterOptions, connector
from tests.certs import Pki, make_pki, make_token
from tests.helpers import short_dir, spawn_agent

START_WITHIN_S = 30


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def wait_for_log(root: Path, needle: str, *, after: int = 0) -> int:
    """Wait until ``needle`` appears in the agent's log past offset ``after``; its offset."""
    deadline = time.monotonic() + START_WITHIN_S
    while time.monotonic() < deadline:
        text = (root / "agent.log").read_text()
        found = text.find(needle, after)
        if found >= 0:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not in the log:\n{(root / 'agent.log').read_text()}")


def tcp_port(root: Path) -> int:
    at = wait_for_log(root, "gRPC serving on 127.0.0.1:")
    line = (root / "agent.log").read_text()[at:].splitlines()[0]
    return int(line.split("127.0.0.1:")[1].split()[0])


@contextlib.contextmanager
def running_agent(root: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], Pki]]:
    pki = make_pki(root / "pki")
    make_token(root / "token")
    process = spawn_agent(
        root,
        "--tcp-listen", "127.0.0.1:0",
        "--set", f"api.tls_cert_file={pki.server_cert}",
        "--set", f"api.tls_key_file={pki.server_key}",
        "--set", f"api.token_file={root / 'token'}",
        "--set", "mps.client_group=gpushare-no-such-group",
        *extra,
    )  # fmt: skip
    try:
        wait_for_log(root, "agent ready")
        yield process, pki
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "Traceback" not in (root / "agent.log").read_text()


@pytest.fixture
def agent(root: Path) -> Iterator[tuple[subprocess.Popen[bytes], Pki]]:
    with running_agent(root) as started:
        yield started


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def ping_code(stub: pb_grpc.AgentStub, token: str) -> grpc.StatusCode:
    try:
        await stub.Ping(pb.PingRequest(), timeout=5, metadata=bearer(token))
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def admit_request(request_id: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(
        request=pb.Request(
            request_id=request_id,
            tenant="team-a",
            trust_domain="team-a",
            priority=pb.BURSTABLE,
            memory_bytes=2**30,
            thread_pct=10,
        )
    )


async def next_event_of(stream: object, lease_id: str) -> pb.Event:
    while True:
        event = await asyncio.wait_for(stream.read(), timeout=10)  # type: ignore[attr-defined]
        assert event is not grpc.aio.EOF, "the stream ended"
        if event.lease_id == lease_id:
            return event  # type: ignore[no-any-return]


async def test_sighup_rotates_the_token_and_keeps_the_open_stream(
    root: Path, agent: tuple[subprocess.Popen[bytes], Pki]
) -> None:
    process, pki = agent
    old = (root / "token").read_text().strip()
    tcp = grpc.aio.secure_channel(f"127.0.0.1:{tcp_port(root)}", tls_credentials(str(pki.ca)))
    unix = grpc.aio.insecure_channel(f"unix:{root / 'agent.sock'}")
    async with tcp, unix:
        remote, local = pb_grpc.AgentStub(tcp), pb_grpc.AgentStub(unix)
        assert await ping_code(remote, old) is grpc.StatusCode.OK
        since = (await local.GetNode(pb.GetNodeRequest(), timeout=5)).last_event_seq
        stream = remote.WatchEvents(pb.WatchEventsRequest(since_seq=since), metadata=bearer(old))
        # the scheduler's own leases: their ids are in its stream (others' are hidden)
        first = await remote.Admit(admit_request("before-reload"), metadata=bearer(old), timeout=5)
        await next_event_of(stream, first.lease.lease_id)

        offset = len((root / "agent.log").read_text())
        new = make_token(root / "token")
        process.send_signal(signal.SIGHUP)
        wait_for_log(root, "token and certificates re-read", after=offset)

        assert await ping_code(remote, old) is grpc.StatusCode.UNAUTHENTICATED
        assert await ping_code(remote, new) is grpc.StatusCode.OK
        second = await remote.Admit(admit_request("after-reload"), metadata=bearer(new), timeout=5)
        event = await next_event_of(stream, second.lease.lease_id)
        assert event.seq > since
        stream.cancel()
        assert await stream.code() is grpc.StatusCode.CANCELLED


async def test_a_bad_token_on_sighup_keeps_the_old_one(
    root: Path, agent: tuple[subprocess.Popen[bytes], Pki]
) -> None:
    process, pki = agent
    old = (root / "token").read_text().strip()
    (root / "token").chmod(0o644)
    offset = len((root / "agent.log").read_text())
    process.send_signal(signal.SIGHUP)
    wait_for_log(root, "kept the previous secret", after=offset)
    assert "0644" in (root / "agent.log").read_text()[offset:]
    tcp = grpc.aio.secure_channel(f"127.0.0.1:{tcp_port(root)}", tls_credentials(str(pki.ca)))
    async with tcp:
        assert await ping_code(pb_grpc.AgentStub(tcp), old) is grpc.StatusCode.OK


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def open_to_others(root: Path) -> list[str]:
    """Files others could write, in directories others could reach (the real MPS control
    daemon makes its pipes 0666: only their directory keeps others out)."""
    found = []
    for directory, _dirs, files in os.walk(root):
        chain = [Path(directory), *Path(directory).relative_to(root).parents]
        reachable = all(mode(root / p) & stat.S_IXOTH for p in chain if (root / p) != root)
        for name in files:
            path = Path(directory) / name
            if reachable and mode(path) & stat.S_IWOTH and not path.is_symlink():
                found.append(f"{path} {mode(path):04o}")
    return found


def test_state_socket_and_pipes_are_closed_to_others(
    root: Path, agent: tuple[subprocess.Popen[bytes], Pki]
) -> None:
    state = root / "state"
    assert mode(state) == 0o700
    stores = sorted(state.glob("gpushare.db*"))
    assert stores and all(mode(p) == 0o600 for p in stores), [(p, oct(mode(p))) for p in stores]
    assert mode(root / "agent.sock") == 0o660
    assert mode(root / "token") == 0o600
    pipes = sorted((root / "mps").glob("*/pipe"))
    logs = sorted((root / "mps").glob("*/log"))
    assert pipes and logs
    # no such group on this machine: the agent's user alone, with a warning
    assert all(mode(p) == 0o700 for p in [*pipes, *logs])
    assert "gpushare-no-such-group" in (root / "agent.log").read_text()
    assert open_to_others(root) == []


def rewrite(path: Path, text: str) -> None:
    """Replace a secret file whole (write aside, mode 0600, rename), as a rotation does."""
    aside = path.with_suffix(".new")
    aside.write_text(text)
    aside.chmod(0o600)
    aside.replace(path)


async def test_kube_serve_follows_a_token_rotation_on_its_open_connection(
    root: Path, agent: tuple[subprocess.Popen[bytes], Pki]
) -> None:
    """The runbook's rotation with `kube serve`'s agent client: its connection stays open
    throughout, and no call is refused (the token file is read at the call after it
    changed)."""
    process, pki = agent
    old, new = secrets_pair()
    mine = root / "kube-token"

    def agent_accepts(*tokens: str) -> None:
        offset = len((root / "agent.log").read_text())
        rewrite(root / "token", "".join(f"scheduler {token}\n" for token in tokens))
        process.send_signal(signal.SIGHUP)
        wait_for_log(root, "token and certificates re-read", after=offset)

    agent_accepts(old)
    make_token(mine, old)
    options = ClusterOptions(
        agent_ca_file=str(pki.ca), agent_token_file=str(mine), agent_server_name=""
    )
    async with connector(options)(f"127.0.0.1:{tcp_port(root)}") as link:
        assert (await link.admit(request_id="with-old", **ASK)).decision.admitted
        agent_accepts(old, new)  # step 2: both
        rewrite(mine, new + "\n")  # step 3: the client gets the new one
        agent_accepts(new)  # step 4: the old one goes
        answer = await link.admit(request_id="with-new", **ASK)  # the same channel
        assert answer.decision.admitted
        await link.release(answer.lease.lease_id)
        mine.unlink()  # a file gone mid-rotation: the last token read is kept
        assert (await link.get_node(ledger_only=True)).devices


ASK = {
    "tenant": "team-a",
    "trust_domain": "team-a",
    "priority": pb.BURSTABLE,
    "memory_bytes": 2**30,
    "thread_pct": 10.0,
}


def secrets_pair() -> tuple[str, str]:
    return secrets.token_hex(32), secrets.token_hex(32)


async def test_a_changed_token_file_is_reloaded_with_no_signal(root: Path) -> None:
    """A Kubernetes Secret update reaches the agent as a new file and no SIGHUP: the agent
    notices the change (api.secrets_check_s) and reloads, as SIGHUP would."""
    with running_agent(root, "--set", "api.secrets_check_s=0.2") as (_process, pki):
        old = (root / "token").read_text().strip()
        tcp = grpc.aio.secure_channel(f"127.0.0.1:{tcp_port(root)}", tls_credentials(str(pki.ca)))
        async with tcp:
            remote = pb_grpc.AgentStub(tcp)
            assert await ping_code(remote, old) is grpc.StatusCode.OK
            offset = len((root / "agent.log").read_text())
            new = secrets.token_hex(32)
            rewrite(root / "token", new + "\n")
            await asyncio.to_thread(
                wait_for_log, root, "token and certificates re-read", after=offset
            )
            assert await ping_code(remote, old) is grpc.StatusCode.UNAUTHENTICATED
            assert await ping_code(remote, new) is grpc.StatusCode.OK
            offset = len((root / "agent.log").read_text())
            rewrite(root / "token", "changeme\n")  # refused: the new token stays
            await asyncio.to_thread(wait_for_log, root, "kept the previous secret", after=offset)
            assert await ping_code(remote, new) is grpc.StatusCode.OK
