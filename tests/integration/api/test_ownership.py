"""A lease belongs to the caller that made it, tried from outside over real TCP listeners:
two token names (and two client certificates) on one agent. Another caller's Release,
Commit, Abort, gang join and request id reuse answer PERMISSION_DENIED; GetNode and
WatchEvents hide other callers' lease ids unless the caller is an observer; the local
socket (the on-call engineer) may act on every lease; the audit log names the owner."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient, Priority, tls_credentials
from agent.runtime.app import App
from tests.certs import make_client, make_pki
from tests.helpers import running_app, short_dir, sim_settings

GiB = 2**30
NAMES = ("alice", "bob", "carol")  # carol: the observer


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
async def agent(root: Path) -> AsyncIterator[tuple[App, dict[str, str]]]:
    tokens = {name: secrets.token_hex(32) for name in NAMES}
    path = root / "tokens"
    path.write_text("".join(f"{name} {token}\n" for name, token in tokens.items()))
    os.chmod(path, 0o600)
    settings = sim_settings(
        root,
        **{
            "api.tcp_listen": "127.0.0.1:0",
            "api.token_file": str(path),
            "api.insecure_loopback": True,
            "api.observers": "carol",
        },
    )
    async with running_app(settings) as app:
        yield app, tokens


def client(app: App, tokens: dict[str, str], name: str) -> AgentClient:
    return AgentClient(f"127.0.0.1:{app.tcp_port}", token=tokens[name], attempts=1)


def local(app: App) -> AgentClient:
    return AgentClient(f"unix:{app.settings.unix_socket_path}", attempts=1)


REQUEST = {"tenant": "team-a", "trust_domain": "team-a", "priority": Priority.BURSTABLE,
           "memory_bytes": 4 * GiB, "thread_pct": 10}  # fmt: skip


async def denied(call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED, caught.value
    return str(caught.value.details())


async def test_only_the_owner_or_the_local_socket_releases(
    agent: tuple[App, dict[str, str]],
) -> None:
    app, tokens = agent
    async with client(app, tokens, "alice") as alice, client(app, tokens, "bob") as bob:
        mine = (await alice.admit(**REQUEST)).lease
        assert mine.owner == "alice"
        message = await denied(bob.release(mine.lease_id))
        assert "another caller" in message and "alice" not in message
        assert (await alice.release(mine.lease_id)).lease.state == "released"
        theirs = (await bob.admit(**REQUEST)).lease
        async with local(app) as oncall:
            assert (await oncall.release(theirs.lease_id)).lease.state == "released"
        await denied(alice.release(theirs.lease_id))  # an ended lease is still bob's


async def test_gangs_are_committed_aborted_and_joined_by_their_owner_only(
    agent: tuple[App, dict[str, str]],
) -> None:
    app, tokens = agent
    async with client(app, tokens, "alice") as alice, client(app, tokens, "bob") as bob:
        await alice.reserve("job-42", **REQUEST)
        await denied(bob.reserve("job-42", **REQUEST))
        await denied(bob.commit("job-42"))
        await denied(bob.abort("job-42"))
        committed = await alice.commit("job-42")
        assert [x.state for x in committed.leases] == ["admitted"]


async def test_a_request_id_of_another_caller_is_refused_without_its_lease(
    agent: tuple[App, dict[str, str]],
) -> None:
    app, tokens = agent
    async with client(app, tokens, "alice") as alice, client(app, tokens, "bob") as bob:
        first = await alice.admit(request_id="r-shared", **REQUEST)
        message = await denied(bob.admit(request_id="r-shared", **REQUEST))
        assert first.lease.lease_id not in message
        again = await alice.admit(request_id="r-shared", **REQUEST)
        assert again.lease.lease_id == first.lease.lease_id


async def test_get_node_shows_other_callers_lease_ids_to_observers_only(
    agent: tuple[App, dict[str, str]],
) -> None:
    app, tokens = agent
    async with (
        client(app, tokens, "alice") as alice,
        client(app, tokens, "bob") as bob,
        client(app, tokens, "carol") as carol,
    ):
        lease_id = (await alice.admit(**REQUEST)).lease.lease_id
        await bob.admit(**REQUEST)

        def ids(node: pb.GetNodeResponse) -> set[str]:
            return {x.lease_id for x in node.leases}

        seen_by_bob = await bob.get_node()
        assert len(seen_by_bob.leases) == 2
        assert lease_id not in ids(seen_by_bob) and "" in ids(seen_by_bob)
        assert lease_id.encode() not in seen_by_bob.SerializeToString()
        assert lease_id in ids(await alice.get_node())
        assert lease_id in ids(await carol.get_node())
        async with local(app) as oncall:
            assert lease_id in ids(await oncall.get_node())


async def events_of(agent_client: AgentClient, until_seq: int) -> list[pb.Event]:
    events: list[pb.Event] = []
    async with asyncio.timeout(10):
        async for event in agent_client.watch_events(since_seq=0):
            events.append(event)
            if event.seq >= until_seq:
                return events
    raise AssertionError("unreachable")


async def test_watch_events_hides_other_callers_lease_ids(
    agent: tuple[App, dict[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    app, tokens = agent
    caplog.set_level(logging.INFO, logger="gpushare.audit")
    async with (
        client(app, tokens, "alice") as alice,
        client(app, tokens, "bob") as bob,
        client(app, tokens, "carol") as carol,
    ):
        lease_id = (await alice.admit(**REQUEST)).lease.lease_id
        await alice.release(lease_id)
        last = (await alice.get_node()).last_event_seq
        for_bob = await events_of(bob, last)
        about = [e for e in for_bob if e.kind in ("lease.admitted", "lease.released")]
        assert len(about) == 2 and all(e.lease_id == "" for e in about)
        assert not any(lease_id.encode() in e.SerializeToString() for e in for_bob)
        assert all("owner" not in e.attrs for e in about)
        for_alice = await events_of(alice, last)
        assert {e.lease_id for e in for_alice if e.kind == "lease.released"} == {lease_id}
        for_carol = await events_of(carol, last)
        assert {e.lease_id for e in for_carol if e.kind == "lease.admitted"} == {lease_id}
    audit = [r.getMessage() for r in caplog.records if lease_id in r.getMessage()]
    assert audit and all("owner=alice" in line for line in audit)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
async def test_a_client_certificate_names_the_owner(root: Path) -> None:
    pki = make_pki(root / "pki")
    other_cert, other_key = make_client(pki, "other", "other-scheduler")
    settings = sim_settings(
        root,
        **{
            "api.tcp_listen": "127.0.0.1:0",
            "api.tls_cert_file": str(pki.server_cert),
            "api.tls_key_file": str(pki.server_key),
            "api.tls_client_ca_file": str(pki.ca),
        },
    )

    def mtls(app: App, cert: Path, key: Path) -> AgentClient:
        credentials = tls_credentials(str(pki.ca), cert_file=str(cert), key_file=str(key))
        return AgentClient(f"127.0.0.1:{app.tcp_port}", credentials=credentials, attempts=1)

    async with (
        running_app(settings) as app,
        mtls(app, pki.client_cert, pki.client_key) as first,
        mtls(app, other_cert, other_key) as second,
    ):
        lease = (await first.admit(**REQUEST)).lease
        assert lease.owner == "gpu-scheduler"
        await denied(second.release(lease.lease_id))
        assert (await first.release(lease.lease_id)).lease.state == "released"
