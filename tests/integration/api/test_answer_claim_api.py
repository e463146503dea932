"""Who may ask AnswerClaim, over the real listeners: the binding controller's credentials on
TCP (a token name, like any scheduler's), and the local socket; a call without them is
UNAUTHENTICATED before anything is decided. The lease admitted belongs to the DRA driver
(owner ``dra``), not to the caller: Prepare, the kubelet's, finds it. A claim over the
size limit is refused, never read."""

from __future__ import annotations

import json
import os
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from agent.api import validate
from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient
from agent.core.errors import ValidationError
from agent.core.lease import CLAIM_OWNER
from agent.runtime.app import App
from tests.dra.fixtures import driver_overrides
from tests.helpers import fake_ports, running_app, short_dir, sim_settings
from tests.kubeworld.apiserver import FakeApiServer

NODE, DRIVER, API_TOKEN = "node-a", "gpushare.io", "api-token"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
async def agent(root: Path) -> AsyncIterator[tuple[App, str]]:
    """A simulated DRA node with a TCP listener; the binding controller's token."""
    token = secrets.token_hex(32)
    tokens = root / "tokens"
    tokens.write_text(f"binding-controller {token}\n")
    os.chmod(tokens, 0o600)
    async with FakeApiServer(token=API_TOKEN) as api:
        api.create_node(NODE)
        settings = sim_settings(
            root,
            **{
                "estimator.model_dir": "none",
                "api.tcp_listen": "127.0.0.1:0",
                "api.token_file": str(tokens),
                "api.insecure_loopback": True,
                **driver_overrides(root, api.url, token=API_TOKEN),
            },
        )
        async with running_app(settings, fake_ports(1)) as app:
            yield app, token


def waiting_claim() -> dict[str, Any]:
    uid = str(uuid.uuid4())
    share = {
        "request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0",
        "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": "2Gi", "threads": "10"},
        "bindingConditions": ["gpushare.io/admitted"],
        "bindingFailureConditions": ["gpushare.io/refused"],
    }  # fmt: skip
    return {
        "metadata": {"name": "c", "namespace": "team-a", "uid": uid},
        "status": {"allocation": {"devices": {"results": [share]}}},
    }


async def test_the_controllers_token_may_ask_and_the_lease_is_the_drivers(
    agent: tuple[App, str],
) -> None:
    app, token = agent
    asked = waiting_claim()
    async with AgentClient(f"127.0.0.1:{app.tcp_port}", token=token, attempts=1) as tcp:
        [answer] = (await tcp.answer_claim(asked)).answers
    assert (answer.device, answer.admitted, answer.reason) == ("gpu-0", True, "Admitted")
    async with AgentClient(f"unix:{app.settings.unix_socket_path}", attempts=1) as local:
        [lease] = (await local.get_node(ledger_only=True)).leases
        [again] = (await local.answer_claim(asked)).answers  # the local socket may ask too
    assert lease.owner == CLAIM_OWNER  # Prepare's, whoever asked
    assert again == answer


@pytest.mark.parametrize("token", ["", "not-the-token"])
async def test_without_the_credentials_nothing_is_decided(
    agent: tuple[App, str], token: str
) -> None:
    app, _ = agent
    async with AgentClient(f"127.0.0.1:{app.tcp_port}", token=token or None, attempts=1) as tcp:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await tcp.answer_claim(waiting_claim())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with AgentClient(f"unix:{app.settings.unix_socket_path}", attempts=1) as local:
        assert list((await local.get_node(ledger_only=True)).leases) == []


async def test_a_claim_over_the_limit_is_refused_unread(agent: tuple[App, str]) -> None:
    app, _ = agent
    huge = waiting_claim()
    huge["metadata"]["annotations"] = {"x": "y" * validate.MAX_CLAIM_BYTES}
    async with AgentClient(f"unix:{app.settings.unix_socket_path}", attempts=1) as local:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await local.answer_claim(huge)
        assert list((await local.get_node(ledger_only=True)).leases) == []
    # the transport's limit comes first (4 MiB a message); the field's is the same
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(ValidationError, match="more than 4194304"):
        validate.claim_json(json.dumps(huge).encode())


async def test_the_client_sends_the_claim_as_json(agent: tuple[App, str]) -> None:
    app, _ = agent
    asked = waiting_claim()
    async with AgentClient(f"unix:{app.settings.unix_socket_path}", attempts=1) as local:
        by_client = (await local.answer_claim(asked)).answers
        raw = pb.AnswerClaimRequest(claim_json=json.dumps(asked).encode())
        by_hand = (await local.stub.AnswerClaim(raw, timeout=5)).answers
    assert list(by_client) == list(by_hand) and len(by_client) == 1
