"""Two users on one GPU, on a real node: the agent's ledger refuses a share of a second UID
on a device that serves another, and the real MPS control daemon shows why (a client of
the second UID, started anyway, waits in CUDA initialisation until the first UID's clients
have ended; the manual's "one server per user at a time").

Needs root (to run clients as two users), a GPU, nvidia-cuda-mps-control and PyTorch;
skipped with the reason otherwise."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.units import GIB
from tests.e2e.test_per_lease_metrics import until
from tests.helpers import subprocess_env
from tests.integration.gpu.test_mps_clients import CLIENT, root, spawn_real_agent  # noqa: F401

pytestmark = pytest.mark.gpu
USERS = (61000, 61001)
WAIT_S = 20.0  # a second user's client still waiting after this long is blocked by MPS


def admit(stub: pb_grpc.AgentStub, name: str, uid: int) -> pb.AdmitResponse | None:
    request = pb.Request(
        request_id=name,
        tenant="team-a",
        trust_domain="team-a",
        priority=pb.BURSTABLE,
        memory_bytes=4 * GIB,
        thread_pct=25.0,
        pod=f"team-a/{name}",
        run_as_uid=uid,
    )
    try:
        answer: pb.AdmitResponse = stub.Admit(pb.AdmitRequest(request=request), timeout=30)
    except grpc.RpcError:
        return None
    return answer


def client_as(uid: int, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CLIENT), str(4 * GIB)],
        env={**subprocess_env(), **env},
        user=uid,
        group=uid,
        extra_groups=[os.getgid()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def line_within(client: subprocess.Popen[str], timeout_s: float) -> str:
    assert client.stdout is not None
    ready, _, _ = select.select([client.stdout], [], [], timeout_s)
    return client.stdout.readline() if ready else ""


def test_a_second_user_is_refused_by_the_ledger_and_blocked_by_mps(root: Path) -> None:  # noqa: F811
    if os.geteuid() != 0:
        pytest.skip("needs root to run CUDA clients as two users")
    agent = spawn_real_agent(root)
    clients: list[subprocess.Popen[str]] = []
    try:
        with grpc.insecure_channel(f"unix:{root / 'agent.sock'}") as channel:
            stub = pb_grpc.AgentStub(channel)
            first = until(lambda: admit(stub, "first", USERS[0]), 60)
            assert isinstance(first, pb.AdmitResponse) and first.decision.admitted
            device = first.lease.device_uuid
            second = admit(stub, "second", USERS[1])
            assert second is not None
            apart = not second.decision.admitted or second.lease.device_uuid != device
            assert apart, "a second user was placed on the first user's GPU"
            if not second.decision.admitted:
                assert second.decision.reason == "USER_CONFLICT", second
            clients.append(client_as(USERS[0], dict(first.env)))
            assert line_within(clients[0], 120), f"first client failed: see {root}/agent.log"
            # the same environment as another user, past the ledger: MPS holds it back
            clients.append(client_as(USERS[1], dict(first.env)))
            assert line_within(clients[1], WAIT_S) == "", "MPS served two users at once"
            clients[0].communicate(timeout=60)  # the first user's client ends
            assert line_within(clients[1], 120), "the second user never got its server"
    finally:
        for client in clients:
            if client.returncode is None:
                client.communicate(timeout=60)
        agent.terminate()
        agent.wait(timeout=60)
        print((root / "agent.log").read_text()[-4000:])
