"""The TCP listener with real certificates made at test time: mutual TLS refuses a client
without a certificate, token-over-TLS refuses a call without the token, and neither speaks
plaintext. Certificates reloaded in place apply to new connections only."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.client import AgentClient, tls_credentials
from agent.runtime import listeners
from agent.runtime.app import App, Ports
from tests.certs import Pki, make_pki, make_token
from tests.helpers import fake_ports, running_app, short_dir, sim_settings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
def pki(root: Path) -> Pki:
    return make_pki(root / "pki")


def ports() -> Ports:
    return fake_ports(1)


@pytest.fixture
async def mtls_agent(root: Path, pki: Pki) -> AsyncIterator[App]:
    settings = sim_settings(
        root,
        **{
            "api.tcp_listen": "127.0.0.1:0",
            "api.tls_cert_file": str(pki.server_cert),
            "api.tls_key_file": str(pki.server_key),
            "api.tls_client_ca_file": str(pki.ca),
        },
    )
    async with running_app(settings, ports()) as app:
        yield app


@pytest.fixture
async def token_agent(root: Path, pki: Pki) -> AsyncIterator[tuple[App, str]]:
    token = make_token(root / "token")
    settings = sim_settings(
        root,
        **{
            "api.tcp_listen": "127.0.0.1:0",
            "api.tls_cert_file": str(pki.server_cert),
            "api.tls_key_file": str(pki.server_key),
            "api.token_file": str(root / "token"),
        },
    )
    async with running_app(settings, ports()) as app:
        yield app, token


async def ping(
    target: str,
    credentials: grpc.ChannelCredentials | None,
    metadata: tuple[tuple[str, str], ...] = (),
) -> grpc.StatusCode:
    channel = (
        grpc.aio.secure_channel(target, credentials)
        if credentials is not None
        else grpc.aio.insecure_channel(target)
    )
    async with channel:
        try:
            await pb_grpc.AgentStub(channel).Ping(pb.PingRequest(), timeout=3, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def mutual(pki: Pki) -> grpc.ChannelCredentials:
    return tls_credentials(
        str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key)
    )


async def test_mutual_tls_needs_a_client_certificate(mtls_agent: App, pki: Pki) -> None:
    target = f"127.0.0.1:{mtls_agent.tcp_port}"
    assert await ping(target, mutual(pki)) is grpc.StatusCode.OK
    assert await ping(target, tls_credentials(str(pki.ca))) is grpc.StatusCode.UNAVAILABLE
    assert await ping(target, None) is grpc.StatusCode.UNAVAILABLE
    async with AgentClient(target, credentials=mutual(pki), attempts=1) as client:
        node = await client.get_node()
    assert len(node.devices) == 1


async def test_a_client_certificate_of_another_ca_is_refused(mtls_agent: App, root: Path) -> None:
    other = make_pki(root / "other", name="intruder")
    target = f"127.0.0.1:{mtls_agent.tcp_port}"
    assert await ping(target, mutual(other)) is grpc.StatusCode.UNAVAILABLE


async def test_token_over_server_tls(token_agent: tuple[App, str], pki: Pki) -> None:
    app, token = token_agent
    target = f"127.0.0.1:{app.tcp_port}"
    server_tls = tls_credentials(str(pki.ca))
    bearer = (("authorization", f"Bearer {token}"),)
    assert await ping(target, server_tls, bearer) is grpc.StatusCode.OK
    assert await ping(target, server_tls) is grpc.StatusCode.UNAUTHENTICATED
    wrong = (("authorization", "Bearer " + "0" * 64),)
    assert await ping(target, server_tls, wrong) is grpc.StatusCode.UNAUTHENTICATED
    assert await ping(target, None, bearer) is grpc.StatusCode.UNAVAILABLE
    async with AgentClient(target, token=token, credentials=server_tls, attempts=1) as client:
        assert (await client.ping()) is not None


async def test_reloaded_certificates_apply_to_new_connections_only(
    mtls_agent: App, pki: Pki, root: Path
) -> None:
    target = f"127.0.0.1:{mtls_agent.tcp_port}"
    old = grpc.aio.secure_channel(target, mutual(pki))
    stub = pb_grpc.AgentStub(old)
    await stub.Ping(pb.PingRequest(), timeout=3)
    fresh = make_pki(root / "fresh", name="rotated")
    kept = make_pki(root / "kept", name="kept")  # a copy of the old set, to dial with
    for name in ("ca.crt", "client.crt", "client.key"):
        (kept.root / name).write_bytes((pki.root / name).read_bytes())
    for name in ("ca.crt", "server.crt", "server.key"):
        (pki.root / name).write_bytes((fresh.root / name).read_bytes())
    assert await ping(target, mutual(kept)) is grpc.StatusCode.OK  # not reloaded yet
    assert listeners.reload_secrets(mtls_agent.servers) == []
    assert await ping(target, mutual(fresh)) is grpc.StatusCode.OK
    assert await ping(target, mutual(kept)) is grpc.StatusCode.UNAVAILABLE
    await stub.Ping(pb.PingRequest(), timeout=3)  # the open connection goes on
    await old.close()


async def test_a_bad_reload_keeps_the_old_certificates(mtls_agent: App, pki: Pki) -> None:
    pki.server_key.write_text("not a key\n")
    problems = listeners.reload_secrets(mtls_agent.servers)
    assert len(problems) == 1 and "api.tls_key_file" in problems[0]
    assert await ping(f"127.0.0.1:{mtls_agent.tcp_port}", mutual(pki)) is grpc.StatusCode.OK
