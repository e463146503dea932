"""Every device in GetNode states what its sharing mode isolates between leases, and every
admitted answer repeats it for the chosen device: the real gRPC server on the Unix socket,
over the simulated node's fakes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.types import Device, SharingMode
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource, fake_uuid
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import Ports
from tests.helpers import running_app, short_dir, sim_settings

HARDWARE = pb.Isolation(memory="hardware", faults="contained", compute="partition")
MPS = pb.Isolation(memory="limit", faults="shared-with-trust-domain", compute="share")
A100 = fake_uuid("GPU", "A100", 0)
H100 = fake_uuid("GPU", "H100", 1)
DEVICES = [
    Device(A100, 0, "A100-SXM4-40GB", 40 * GIB, SharingMode.EXCLUSIVE),
    Device(H100, 1, "H100-SXM5-80GB", 80 * GIB, SharingMode.MPS),
    Device(
        fake_uuid("MIG", "H200", 2),
        2,
        "H200-SXM-141GB",
        70 * GIB,
        SharingMode.MPS,
        parent_uuid=fake_uuid("GPU", "H200", 2),
        mig_profile="4g.71gb",
    ),
]


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def ports() -> Ports:
    return Ports(
        gpu=FakeGpuBackend(DEVICES),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )


def request(request_id: str, gpu_model: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(
        request=pb.Request(
            request_id=request_id,
            tenant="t",
            trust_domain="a",
            priority=pb.BURSTABLE,
            memory_bytes=10 * GIB,
            thread_pct=25,
            gpu_model=gpu_model,
        )
    )


async def test_get_node_and_admit_state_the_isolation(root: Path) -> None:
    settings = sim_settings(root)
    async with (
        running_app(settings, ports()),
        grpc.aio.insecure_channel(f"unix:{settings.unix_socket_path}") as channel,
    ):
        stub = pb_grpc.AgentStub(channel)
        node = await stub.GetNode(pb.GetNodeRequest(), timeout=5)
        assert [(d.sharing_mode, d.isolation) for d in node.devices] == [
            ("exclusive", HARDWARE),
            ("mps", MPS),
            ("mps", MPS),  # a MIG instance shared by MPS: its leases share one server
        ]
        for gpu_model, device_uuid, isolation in [("A100", A100, HARDWARE), ("H100", H100, MPS)]:
            answer = await stub.Admit(request(f"job-{gpu_model}", gpu_model), timeout=5)
            assert answer.decision.admitted, answer.decision.message
            assert answer.lease.device_uuid == device_uuid
            assert answer.isolation == isolation
        refused = await stub.Admit(request("job-busy", "A100"), timeout=5)
        assert not refused.decision.admitted and not refused.HasField("isolation")
