"""Per-lease metrics on /metrics of a real ``gpushare serve --sim``: a lease admitted for a
pod, two simulated workload processes run with the environment it was given (each declaring
the device memory it uses to the simulated NVML) and connected to its MPS daemon; the
series carry the lease, pod, namespace and device, the used memory is their sum, and
every series of the lease is gone once it is released."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.units import GIB
from agent.sim.processes import USED_MEMORY_VAR
from tests.helpers import short_dir, spawn_agent
from tests.integration.mps.harness import FAKE_BINARY

POD = "team-a/train-42-0"
HTTP_PORT = re.compile(r"HTTP serving /metrics /healthz /readyz on [\d.]+:(\d+)")
ONE_GPU = "version: 1\ndevices:\n  - {model: H100-SXM5-80GB, memory: 80GiB}\n"
Series = dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def until(what: Callable[[], object], timeout_s: float = 20.0) -> object:
    deadline = time.monotonic() + timeout_s
    while not (found := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return found


def http_port(root: Path) -> int | None:
    log = root / "agent.log"
    found = HTTP_PORT.search(log.read_text()) if log.exists() else None
    return int(found.group(1)) if found else None


def scrape(port: int) -> Series:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    families = text_string_to_metric_families(text)
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in families}


def admit(stub: pb_grpc.AgentStub) -> pb.AdmitResponse:
    request = pb.Request(
        request_id="train-42",
        tenant="team-a",
        trust_domain="team-a",
        priority=pb.BURSTABLE,
        memory_bytes=20 * GIB,
        thread_pct=25,
        pod=POD,
    )
    answer: pb.AdmitResponse = stub.Admit(pb.AdmitRequest(request=request), timeout=10)
    return answer


def workload(env: dict[str, str], used: str) -> subprocess.Popen[bytes]:
    """A process run with the lease's environment, declaring its device memory in use."""
    return subprocess.Popen(["sleep", "120"], env={**os.environ, **env, USED_MEMORY_VAR: used})


def connect(pipe_dir: str, pid: int) -> bool:
    """Connect ``pid`` as an MPS client (the fake daemon may be between probes)."""
    done = subprocess.run(
        [FAKE_BINARY],
        input=f"fake_connect_client {pid} {os.getuid()}\n",
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return done.returncode == 0


def used_bytes(port: int, lease_id: str) -> float | None:
    series = scrape(port).get("gpushare_lease_memory_used_bytes", [])
    return next((v for labels, v in series if labels["lease"] == lease_id), None)


def test_lease_series_follow_the_lease_and_go_with_it(root: Path) -> None:
    (root / "node.yaml").write_text(ONE_GPU)
    agent = spawn_agent(
        root,
        "--set", f"sim.node_file={root / 'node.yaml'}",
        "--http-listen", "127.0.0.1:0",
        "--set", f"mps.control_binary={FAKE_BINARY}",
        "--set", "mps.probe_interval_s=0.2",
        "--set", "janitor.interval_s=0.3",
        "--set", "readiness.interval_s=0.2",
        "--set", "runtime.on_stop=quit",
        "--set", "estimator.model_dir=none",  # one lease: 1.0 by any estimator
    )  # fmt: skip
    workers: list[subprocess.Popen[bytes]] = []
    try:
        port = int(str(until(lambda: http_port(root))))
        with grpc.insecure_channel(f"unix:{root / 'agent.sock'}") as channel:
            stub = pb_grpc.AgentStub(channel)
            answer = until(lambda: _try_admit(stub))
            assert isinstance(answer, pb.AdmitResponse)
            lease = answer.lease
            env = dict(answer.env)
            workers = [workload(env, "1GiB"), workload(env, "2GiB")]
            for worker in workers:
                until(lambda w=worker: connect(env["CUDA_MPS_PIPE_DIRECTORY"], w.pid))  # type: ignore[misc]
            until(lambda: used_bytes(port, lease.lease_id) == 3 * GIB)
            until(lambda: _state(scrape(port), lease.lease_id) == "ready")
            series = scrape(port)
            labels = {
                "lease": lease.lease_id,
                "pod": "train-42-0",
                "namespace": "team-a",
                "device": lease.device_uuid,
            }
            assert series["gpushare_lease_memory_limit_bytes"] == [(labels, 20 * GIB)]
            assert series["gpushare_lease_memory_used_bytes"] == [(labels, 3 * GIB)]
            assert series["gpushare_lease_threads_pct"] == [(labels, 25.0)]
            assert series["gpushare_lease_retention_estimate_ratio"] == [(labels, 1.0)]
            assert sorted(series["gpushare_lease_state"], key=lambda s: s[0]["state"]) == [
                ({**labels, "state": "admitted"}, 0.0),
                ({**labels, "state": "ready"}, 1.0),
                ({**labels, "state": "reserved"}, 0.0),
            ]
            stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id), timeout=10)
            after = scrape(port)
            left = [
                (name, x) for name, samples in after.items() for x, _ in samples if "lease" in x
            ]
            assert not left, "an ended lease leaves no series"
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(timeout=10)
        agent.terminate()
        agent.wait(timeout=30)


def _try_admit(stub: pb_grpc.AgentStub) -> pb.AdmitResponse | None:
    try:
        return admit(stub)
    except grpc.RpcError:
        return None  # the socket is not served yet


def _state(series: Series, lease_id: str) -> str | None:
    return next(
        (
            labels["state"]
            for labels, value in series.get("gpushare_lease_state", [])
            if labels["lease"] == lease_id and value == 1.0
        ),
        None,
    )
