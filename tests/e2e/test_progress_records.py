"""The learning loop's input end to end, against a real ``gpushare serve --sim`` agent: a
workload reports its progress with ``gpushare report`` and with the client, alone and next
to another lease; the agent turns that into a run record, RetrainEstimator counts it (too
few to train on), a restart keeps it, and the CLI's malformed reports exit 2."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.client import AgentClient
from tests.e2e.test_cli_session import QUIT_AT_STOP, run, wait_for_socket
from tests.helpers import short_dir, spawn_agent

SETTINGS = (
    *QUIT_AT_STOP,
    *("--set", "estimator.progress_window_s=0.2"),
    *("--set", "estimator.base_data=none"),
    *("--set", "estimator.retrain_min_records=100"),
)
WINDOW_S = 0.3  # a little more than the progress window


def stub_call(root: Path, method: str, request: object) -> object:
    with grpc.insecure_channel(f"unix:{root / 'agent.sock'}") as channel:
        return getattr(pb_grpc.AgentStub(channel), method)(request, timeout=30)


def admit(root: Path, request_id: str, profile: str) -> pb.Lease:
    request = pb.Request(
        request_id=request_id, tenant="team-a", trust_domain="team-a", priority=pb.BURSTABLE,
        memory_bytes=4 * 2**30, thread_pct=25, profile=profile,
    )  # fmt: skip
    answer = stub_call(root, "Admit", pb.AdmitRequest(request=request))
    assert isinstance(answer, pb.AdmitResponse) and answer.decision.admitted
    return answer.lease


def client_report(root: Path, lease_id: str, units: float) -> pb.ReportProgressResponse:
    async def report() -> pb.ReportProgressResponse:
        async with AgentClient(f"unix:{root / 'agent.sock'}", attempts=1) as agent:
            return await agent.report_progress(lease_id, units)

    return asyncio.run(report())


def node_records(root: Path) -> int:
    answer = stub_call(root, "RetrainEstimator", pb.RetrainEstimatorRequest())
    assert isinstance(answer, pb.RetrainEstimatorResponse) and not answer.swapped
    assert "fewer than estimator.retrain_min_records (100)" in answer.reason
    return answer.node_records


def stop(agent: subprocess.Popen[bytes]) -> int:
    agent.send_signal(signal.SIGTERM)
    return agent.wait(timeout=20)


def test_reports_become_run_records_that_a_restart_keeps() -> None:
    with short_dir() as root:
        agent = spawn_agent(root, *SETTINGS)
        try:
            wait_for_socket(root, agent)
            a = admit(root, "train-a", "resnet50")
            first = run(root, f"gpushare report {a.lease_id} 0")
            assert first.returncode == 0, first.stdout
            assert f"lease {a.lease_id}: 0 units; window 0.0 s, no rate yet, 0 peer(s)" in (
                first.stdout
            )
            time.sleep(WINDOW_S)
            assert client_report(root, a.lease_id, 100).rate_per_s > 0  # alone
            b = admit(root, "train-b", "bert")
            assert b.device_uuid == a.device_uuid
            client_report(root, a.lease_id, 100)
            time.sleep(WINDOW_S)
            together = run(root, f"gpushare report {a.lease_id} 150 --json")
            assert together.returncode == 0, together.stdout
            answer = json.loads(together.stdout)
            assert answer["peers"] == 1 and answer["rate_per_s"] > 0
            stub_call(root, "Release", pb.ReleaseRequest(lease_id=b.lease_id))
            assert node_records(root) == 1

            backwards = run(root, f"gpushare report {a.lease_id} 10")
            assert backwards.returncode == 2 and "went backwards: 10 after 150" in backwards.stdout
            nan = run(root, f"gpushare report {a.lease_id} nan")
            assert nan.returncode == 2 and "must be a finite number >= 0" in nan.stdout
            negative = run(root, f"gpushare report {a.lease_id} -5")
            assert negative.returncode == 2
            unknown = run(root, "gpushare report l-AAAAAAAAAAAAAAAA 1")
            assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stdout
        finally:
            assert stop(agent) == 0
        (root / "agent.log").unlink()  # "agent ready" is the next agent's
        again = spawn_agent(root, *SETTINGS)
        try:
            wait_for_socket(root, again)
            assert node_records(root) == 1
        finally:
            assert stop(again) == 0
