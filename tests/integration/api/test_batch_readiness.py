"""AdmitBatch orders candidates by predicted readiness (the shipped model), arrival order
breaking ties, and places them in that order; without a predictor it keeps arrival order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.units import GIB
from agent.estimator.readiness import DEFAULT_READINESS_DIR, ReadinessModel
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import Ports
from tests.helpers import running_app, short_dir, sim_settings

UNLIKELY = pb.Job(job_type="dev", model_type="dev", scheduling_delay_s=36_000)
LIKELY = pb.Job(job_type="online_inference", model_type="rec", scheduling_delay_s=10)


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def batch() -> list[pb.Request]:
    """Three unlikely jobs arrive first, then three likely ones; four fit (30 GiB each on
    two 80 GiB devices)."""
    jobs = [UNLIKELY] * 3 + [LIKELY] * 3
    return [
        pb.Request(
            request_id=f"b{i}",
            tenant="t",
            trust_domain="a",
            priority=pb.BURSTABLE,
            memory_bytes=30 * GIB,
            thread_pct=25,
            job=job,
        )
        for i, job in enumerate(jobs)
    ]


async def place(root: Path, model_dir: str) -> pb.AdmitBatchResponse:
    ports = Ports(
        gpu=FakeGpuBackend.with_gpus(2),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )
    settings = sim_settings(root, **{"readiness.model_dir": model_dir})
    async with (
        running_app(settings, ports) as app,
        grpc.aio.insecure_channel(f"unix:{app.settings.unix_socket_path}") as channel,
    ):
        return await pb_grpc.AgentStub(channel).AdmitBatch(pb.AdmitBatchRequest(requests=batch()))


async def test_the_likely_ready_are_placed_first(root: Path) -> None:
    answer = await place(root, "default")
    assert answer.ordered_by == "predicted readiness"
    p = list(answer.ready_probability)
    assert len(p) == 6 and min(p[3:]) > max(p[:3]), "the shipped model tells them apart"
    assert list(answer.order) == ["b3", "b4", "b5", "b0", "b1", "b2"]
    admitted = [
        r.request_id for r in batch() if answer.results[int(r.request_id[1:])].decision.admitted
    ]
    assert admitted == ["b0", "b3", "b4", "b5"]
    assert answer.results[1].decision.reason == "NO_MEMORY"


async def test_without_a_predictor_arrival_order_is_kept(root: Path) -> None:
    answer = await place(root, "none")
    assert answer.ordered_by == "arrival" and list(answer.ready_probability) == []
    assert list(answer.order) == [f"b{i}" for i in range(6)]
    assert [r.decision.admitted for r in answer.results] == [True] * 4 + [False] * 2


def test_the_shipped_model_says_it_is_synthetic() -> None:
    model = ReadinessModel.load(DEFAULT_READINESS_DIR)
    assert "SYNTHETIC" in model.metadata["provenance"]
