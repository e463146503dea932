"""A graceful stop leaves the MPS daemons and their clients running; the next agent adopts
them and restores the leases (runtime.on_stop: keep, the default). With on_stop quit the
daemons go with the agent; with drain, admissions are refused while leases end.

Real agent processes and signals; the fake control binary stands in for the driver's so a
client can be connected without a GPU (it answers in the real binary's formats)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.state.migrations import MIGRATIONS, schema_version
from tests.helpers import short_dir, spawn_agent
from tests.integration.mps.harness import FAKE_BINARY

START_WITHIN_S = 30.0
GIB = 2**30


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def agent(root: Path, on_stop: str) -> subprocess.Popen[bytes]:
    return spawn_agent(
        root, "--set", f"runtime.on_stop={on_stop}", "--set", f"mps.control_binary={FAKE_BINARY}",
        "--set", "mps.probe_interval_s=0.2", "--set", "runtime.drain_timeout_s=20",
    )  # fmt: skip


def stub(root: Path) -> pb_grpc.AgentStub:
    return pb_grpc.AgentStub(grpc.insecure_channel(f"unix:{root / 'agent.sock'}"))


def node_up(root: Path, process: subprocess.Popen[bytes]) -> pb.GetNodeResponse:
    deadline = time.monotonic() + START_WITHIN_S
    while time.monotonic() < deadline:
        assert process.poll() is None, (root / "agent.log").read_text()[-2000:]
        try:
            node = stub(root).GetNode(pb.GetNodeRequest(), timeout=2)
            if node.mps and all(d.up for d in node.mps):
                return node
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise AssertionError("the agent did not come up")


def admit(root: Path, request_id: str) -> pb.AdmitResponse:
    request = pb.Request(
        request_id=request_id, tenant="t", trust_domain="t", priority=pb.BURSTABLE,
        memory_bytes=4 * GIB, thread_pct=10,
    )  # fmt: skip
    answer: pb.AdmitResponse = stub(root).Admit(pb.AdmitRequest(request=request), timeout=10)
    assert answer.decision.admitted, answer.decision.message
    return answer


def connect_client(pipe_dir: str, client_pid: int) -> None:
    """What a CUDA process connecting to the daemon would cause."""
    subprocess.run(
        [FAKE_BINARY], input=f"fake_connect_client {client_pid} 0\n", text=True, check=True,
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir}, capture_output=True, timeout=10,
    )  # fmt: skip


def clients_of(root: Path, device_uuid: str, within_s: float = 5.0) -> list[int]:
    """The device's MPS clients once the agent has probed its daemon (or [] after)."""
    deadline = time.monotonic() + within_s
    while True:
        node = stub(root).GetNode(pb.GetNodeRequest(), timeout=2)
        daemon = next(d for d in node.mps if d.device_uuid == device_uuid)
        clients = [c for server in daemon.servers for c in server.client_pids]
        if clients or time.monotonic() > deadline:
            return clients
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0] != "Z"


def stopped(process: subprocess.Popen[bytes], signum: int = signal.SIGTERM) -> int:
    process.send_signal(signum)
    return process.wait(timeout=30)


@contextlib.contextmanager
def agent_with_a_job(
    root: Path, request_id: str
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, int], pb.Lease, int]]:
    """An agent (on_stop keep) with one lease and a job connected to its device's server:
    the agent, its daemons by device, the lease and the job's PID (killed at the end)."""
    first = agent(root, "keep")
    node = node_up(root, first)
    daemons = {d.device_uuid: d.pid for d in node.mps}
    lease = admit(root, request_id).lease
    pipe_dir = next(d.pipe_dir for d in node.mps if d.device_uuid == lease.device_uuid)
    client = subprocess.Popen(["sleep", "120"])  # the job: a client of the device's server
    try:
        connect_client(pipe_dir, client.pid)
        yield first, daemons, lease, client.pid
    finally:
        client.kill()
        client.wait()


def test_sigterm_keeps_the_daemons_and_clients_and_the_next_agent_adopts_them(
    root: Path,
) -> None:
    with agent_with_a_job(root, "r-kept") as (first, daemons, lease, client):
        assert stopped(first) == 0
        assert all(alive(pid) for pid in daemons.values()), "a daemon went with the agent"
        assert "left running for the next agent" in (root / "agent.log").read_text()

        second = agent(root, "quit")
        try:
            node = node_up(root, second)
            assert {d.device_uuid: d.pid for d in node.mps} == daemons  # adopted, not replaced
            assert clients_of(root, lease.device_uuid) == [client]
            assert [x.lease_id for x in node.leases] == [lease.lease_id]
            assert "daemon_adopted" in (root / "agent.log").read_text()
        finally:
            assert stopped(second) == 0
        assert not any(alive(pid) for pid in daemons.values()), "quit leaves no daemon"


def as_written_by_schema_6(db_path: Path) -> None:
    """The store as the release before schema 7 left it (the upgrade's starting point):
    five migrations to apply."""
    db = sqlite3.connect(db_path, isolation_level=None)
    try:
        assert schema_version(db) == len(MIGRATIONS) == 11
        db.executescript(
            "BEGIN; ALTER TABLE leases DROP COLUMN owner; ALTER TABLE leases DROP COLUMN workload;"
            " ALTER TABLE leases DROP COLUMN pod; ALTER TABLE leases DROP COLUMN run_as_uid;"
            " DROP TABLE allocations; DROP TABLE run_records;"
            " DELETE FROM schema_version WHERE version >= 7; COMMIT;"
        )
    finally:
        db.close()


def test_an_upgrade_that_migrates_the_store_keeps_daemons_clients_and_leases(
    root: Path,
) -> None:
    with agent_with_a_job(root, "r-upgraded") as (first, daemons, lease, client):
        assert stopped(first) == 0
        as_written_by_schema_6(root / "state" / "gpushare.db")

        second = agent(root, "quit")
        try:
            node = node_up(root, second)
            assert {d.device_uuid: d.pid for d in node.mps} == daemons
            assert clients_of(root, lease.device_uuid) == [client]
            assert [(x.lease_id, x.device_index) for x in node.leases] == [
                (lease.lease_id, lease.device_index)
            ]
        finally:
            assert stopped(second) == 0
    db = sqlite3.connect(root / "state" / "gpushare.db")
    assert schema_version(db) == len(MIGRATIONS)
    db.close()


def test_drain_refuses_admissions_and_waits_for_the_leases(root: Path) -> None:
    process = agent(root, "drain")
    node = node_up(root, process)
    daemons = [d.pid for d in node.mps]
    lease = admit(root, "r-drained").lease
    process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while "draining" not in (root / "agent.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(grpc.RpcError) as refused:
        admit(root, "r-too-late")
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "draining" in (refused.value.details() or "")
    assert process.poll() is None, "still waiting for the lease"
    stub(root).Release(pb.ReleaseRequest(lease_id=lease.lease_id), timeout=5)
    assert process.wait(timeout=30) == 0
    assert "drained: 0 live lease(s) left" in (root / "agent.log").read_text()
    assert not any(alive(pid) for pid in daemons)
