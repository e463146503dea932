"""One user per MPS device, end to end: Admit over gRPC on loopback (TCP with a token, the
typed client) against a simulated one-GPU agent. A share of another UID is refused
USER_CONFLICT with the reason in a sentence; the same UID and a caller that does not say
its UID are admitted; the leases carry their UID (unset when unknown)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient, Priority
from agent.core.units import GIB
from agent.runtime.app import App
from tests.certs import make_token
from tests.helpers import fake_ports, running_app, short_dir, sim_settings

TOKEN = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6071"
CONFLICT = (
    "device's MPS server runs as UID 1000; a client of UID 2000 would wait in CUDA "
    "initialisation until every client of UID 1000 ends (one user per MPS control daemon)"
)


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
async def agent(root: Path) -> AsyncIterator[App]:
    make_token(root / "token", TOKEN)
    settings = sim_settings(
        root,
        **{
            "api.tcp_listen": "127.0.0.1:0",
            "api.token_file": str(root / "token"),
            "api.insecure_loopback": True,
            "estimator.model_dir": "none",
        },
    )
    async with running_app(settings, fake_ports(1)) as app:
        yield app


@pytest.fixture
async def client(agent: App) -> AsyncIterator[AgentClient]:
    async with AgentClient(f"127.0.0.1:{agent.tcp_port}", token=TOKEN, attempts=1) as found:
        yield found


async def admit(client: AgentClient, request_id: str, uid: int | None) -> pb.AdmitResponse:
    """A small burstable share of one trust domain: only its UID can keep it out."""
    return await client.admit(
        request_id=request_id,
        tenant="team-a",
        trust_domain="team-a",
        priority=Priority.BURSTABLE,
        memory_bytes=2 * GIB,
        thread_pct=10,
        run_as_uid=uid,
    )


async def test_a_device_serves_one_uid_and_callers_that_do_not_say(client: AgentClient) -> None:
    first = await admit(client, "uid-1000-a", 1000)
    other = await admit(client, "uid-2000", 2000)
    same = await admit(client, "uid-1000-b", 1000)
    unsaid = await admit(client, "uid-unsaid", None)
    assert first.decision.admitted and first.lease.run_as_uid == 1000
    assert not other.decision.admitted and other.decision.reason == "USER_CONFLICT"
    assert CONFLICT in other.decision.message
    assert [(a.reason, a.detail) for a in other.decision.attempts] == [("USER_CONFLICT", CONFLICT)]
    assert same.decision.admitted and same.lease.device_uuid == first.lease.device_uuid
    assert unsaid.decision.admitted and not unsaid.lease.HasField("run_as_uid")
    node = await client.get_node(ledger_only=True)
    uids = {x.request_id: x.run_as_uid if x.HasField("run_as_uid") else None for x in node.leases}
    assert uids == {"uid-1000-a": 1000, "uid-1000-b": 1000, "uid-unsaid": None}


async def test_explain_names_the_user_conflict(client: AgentClient) -> None:
    await admit(client, "uid-1000", 1000)
    answer = await client.explain(
        tenant="team-a",
        trust_domain="team-a",
        priority=Priority.BURSTABLE,
        memory_bytes=2 * GIB,
        thread_pct=10,
        run_as_uid=2000,
    )
    assert not answer.decision.admitted and answer.decision.reason == "USER_CONFLICT"
    assert answer.decision.attempts[0].detail == CONFLICT


@pytest.mark.parametrize("uid", [-1, 4294967295])
async def test_a_uid_that_is_not_one_is_invalid_argument(client: AgentClient, uid: int) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await admit(client, "bad-uid", uid)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "request.run_as_uid: must be a UID from 0 to 4294967294" in str(refused.value.details())
