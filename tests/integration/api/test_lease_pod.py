"""A lease made for a Kubernetes pod carries "<namespace>/<name>" in every answer, and in
the store across a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.units import GIB
from agent.runtime.app import App, Ports
from tests.helpers import fake_ports, running_app, short_dir, sim_settings

POD = "team-a/train-42-0"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def ports() -> Ports:
    return fake_ports(2)


def socket_of(app: App) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"unix:{app.settings.unix_socket_path}")


def request(request_id: str, pod: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(
        request=pb.Request(
            request_id=request_id,
            tenant="team-a",
            trust_domain="team-a",
            priority=pb.BURSTABLE,
            memory_bytes=4 * GIB,
            thread_pct=25,
            pod=pod,
        )
    )


async def test_the_pod_is_in_the_answers_and_survives_a_restart(root: Path) -> None:
    settings = sim_settings(root, **{"estimator.model_dir": "none"})
    async with running_app(settings, ports()) as app, socket_of(app) as channel:
        stub = pb_grpc.AgentStub(channel)
        admitted = await stub.Admit(request("uid-1", POD))
        again = await stub.Admit(request("uid-1", POD))
        with pytest.raises(grpc.aio.AioRpcError) as other:  # another pod: not a retry
            await stub.Admit(request("uid-1", "team-a/another"))
    assert admitted.lease.pod == POD and again.lease.lease_id == admitted.lease.lease_id
    assert other.value.code() is grpc.StatusCode.ALREADY_EXISTS
    assert "pod: 'team-a/train-42-0' then 'team-a/another'" in str(other.value.details())
    async with running_app(settings, ports()) as app, socket_of(app) as channel:
        node = await pb_grpc.AgentStub(channel).GetNode(pb.GetNodeRequest())
    assert [(x.lease_id, x.pod) for x in node.leases] == [(admitted.lease.lease_id, POD)]
