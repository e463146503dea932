"""A real agent on a real GPU: leases admitted over gRPC, CUDA clients run with the
environment each lease was given, and their limits enforced by the real MPS server.

Each client must see its thread share as fewer multiprocessors, allocate under its pinned
memory limit, fail to allocate over it, and show up in the agent's per-lease memory metric
through NVML. Skipped with a reason where there is no GPU, no MPS control binary or no
PyTorch to build a CUDA client with.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.units import GIB
from tests.e2e.test_per_lease_metrics import http_port, scrape, until
from tests.helpers import agent_command, short_dir, subprocess_env

pytestmark = pytest.mark.gpu

CLIENT = Path(__file__).with_name("cuda_client.py")
LEASES = {"small": (4 * GIB, 25.0), "large": (8 * GIB, 50.0)}


@pytest.fixture
def root() -> Iterator[Path]:
    if not shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("needs nvidia-cuda-mps-control on PATH")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch with CUDA to run a client")
    with short_dir() as path:
        yield path


def full_sm_count() -> int:
    """Multiprocessors a client sees without MPS (no agent is running yet)."""
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.get_device_properties(0)"
         ".multi_processor_count)"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return int(done.stdout.strip())


def spawn_real_agent(root: Path) -> subprocess.Popen[bytes]:
    command = agent_command(
        "--socket", str(root / "agent.sock"),
        "serve",
        "--http-listen", "127.0.0.1:0",
        "--set", f"paths.runtime_dir={root}",
        "--set", f"paths.state_dir={root}/state",
        "--set", "runtime.on_stop=quit",
        "--set", "mps.probe_interval_s=0.5",
    )  # fmt: skip
    with open(root / "agent.log", "ab") as log:
        return subprocess.Popen(
            command, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=log
        )


def admit(stub: pb_grpc.AgentStub, name: str) -> pb.AdmitResponse | None:
    memory_bytes, thread_pct = LEASES[name]
    request = pb.Request(
        request_id=name,
        tenant="team-a",
        trust_domain="team-a",
        priority=pb.BURSTABLE,
        memory_bytes=memory_bytes,
        thread_pct=thread_pct,
        pod=f"team-a/{name}-0",
    )
    try:
        answer: pb.AdmitResponse = stub.Admit(pb.AdmitRequest(request=request), timeout=30)
    except grpc.RpcError:
        return None  # not serving yet
    return answer


def start_client(env: dict[str, str], limit_bytes: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CLIENT), str(limit_bytes)],
        env={**subprocess_env(), **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def used_bytes(port: int, lease_id: str) -> float:
    series = scrape(port).get("gpushare_lease_memory_used_bytes", [])
    return next((v for labels, v in series if labels["lease"] == lease_id), 0.0)


def test_clients_run_under_the_limits_of_their_leases(root: Path) -> None:
    full = full_sm_count()
    agent = spawn_real_agent(root)
    clients: list[subprocess.Popen[str]] = []
    try:
        port = int(str(until(lambda: http_port(root), timeout_s=60)))
        with grpc.insecure_channel(f"unix:{root / 'agent.sock'}") as channel:
            stub = pb_grpc.AgentStub(channel)
            answers: dict[str, pb.AdmitResponse] = {}
            for name in LEASES:
                answer = until(lambda n=name: admit(stub, n), 60)  # type: ignore[misc]
                assert isinstance(answer, pb.AdmitResponse)
                answers[name] = answer
                clients.append(start_client(dict(answer.env), LEASES[name][0]))
            reports = {}
            for name, client in zip(LEASES, clients, strict=True):
                assert client.stdout is not None
                line = client.stdout.readline()
                assert line, f"client {name} exited: see {root / 'agent.log'}"
                reports[name] = json.loads(line)
            print(json.dumps({"full_sm_count": full, **reports}, indent=1))
            for name, report in reports.items():
                memory_bytes, thread_pct = LEASES[name]
                assert report["under_limit_ok"] and not report["over_limit_ok"], report
                assert report["sm_count"] < full, f"{name}: the thread share is not applied"
                assert report["sm_count"] <= math.ceil(full * thread_pct / 100) + 2, report
                lease_id = answers[name].lease.lease_id
                until(lambda i=lease_id, m=memory_bytes: used_bytes(port, i) >= m // 2, 30)  # type: ignore[misc]
            status = subprocess.run(
                agent_command("--socket", str(root / "agent.sock"), "mps", "status"),
                env=subprocess_env(), capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            print(status.stdout)
            assert status.returncode == 0, status.stderr
            for answer in answers.values():
                stub.Release(pb.ReleaseRequest(lease_id=answer.lease.lease_id), timeout=10)
    finally:
        for client in clients:
            client.communicate(timeout=60)  # closes its input: it frees its memory and exits
        agent.terminate()
        agent.wait(timeout=60)
        print((root / "agent.log").read_text()[-4000:])
