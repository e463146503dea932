"""Property-based tests over every RPC's fields against the real daemon: hostile or
malformed input only ever yields a decision or a clear refusal, never INTERNAL or a crash."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from tests.certs import make_token
from tests.helpers import short_dir, spawn_agent

TOKEN = "f0221e55c0ffee0123456789abcdef0123456789abcdef"
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,  # a request id reused for a different request
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
}
EXAMPLES = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def agent() -> Iterator[tuple[pb_grpc.AgentStub, pb_grpc.AgentStub, subprocess.Popen[bytes]]]:
    with short_dir() as root:
        make_token(root / "token", TOKEN)
        process = spawn_agent(
            root,
            "--tcp-listen",
            "127.0.0.1:0",
            "--set",
            f"api.token_file={root / 'token'}",
            "--set",
            "api.insecure_loopback=true",
        )
        unix = grpc.insecure_channel(f"unix:{root / 'agent.sock'}")
        stub = pb_grpc.AgentStub(unix)
        for _ in range(150):
            try:
                stub.Ping(pb.PingRequest(), timeout=1)
                break
            except grpc.RpcError:
                time.sleep(0.1)
        port = _tcp_port(root / "agent.log")
        tcp = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            yield stub, pb_grpc.AgentStub(tcp), process
        finally:
            unix.close()
            tcp.close()
            process.terminate()
            process.wait(timeout=30)
            assert "Traceback" not in (root / "agent.log").read_text()


def _tcp_port(log: Path) -> int:
    for _ in range(100):
        for line in log.read_text().splitlines():
            if "gRPC serving on 127.0.0.1:" in line:
                return int(line.split("127.0.0.1:")[1].split()[0])
        time.sleep(0.1)
    raise AssertionError("no TCP listener in the log")


def outcome(call: object, request: object, **kwargs: object) -> grpc.StatusCode:
    try:
        call(request, timeout=5, **kwargs)  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


texts = st.text(max_size=300)
floats = st.floats(allow_nan=True, allow_infinity=True)
uint64 = st.integers(min_value=0, max_value=2**64 - 1)
uint32 = st.integers(min_value=0, max_value=2**32 - 1)
sizings = st.builds(
    pb.Sizing,
    parameters=uint64,
    mode=st.sampled_from(["", "training", "inference", "x"]) | texts,
    dtype=texts,
    layers=uint32,
    kv_heads=uint32,
    head_dim=uint32,
    context_length=uint32,
    concurrent_sequences=uint32,
)
jobs = st.builds(
    pb.Job,
    job_type=texts,
    model_type=texts,
    generative=st.booleans(),
    requested_gpus=floats,
    declared_duration_s=floats,
    scheduling_delay_s=floats,
)
requests = st.builds(
    pb.Request,
    request_id=texts,
    tenant=texts,
    trust_domain=texts,
    priority=st.integers(min_value=-5, max_value=10),
    memory_bytes=uint64,
    thread_pct=floats,
    profile=texts,
    retention_floor=floats,
    gpu_model=texts,
    job=jobs,
) | st.builds(
    pb.Request,
    request_id=st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True),
    tenant=st.just("t"),
    trust_domain=st.sampled_from(["a", "b"]),
    priority=st.integers(min_value=0, max_value=4),
    sizing=sizings,
    thread_pct=floats,
)


@EXAMPLES
@given(request=requests)
def test_admit_explain_and_reserve(agent: tuple, request: pb.Request) -> None:  # type: ignore[type-arg]
    stub, _tcp, process = agent
    assert outcome(stub.Admit, pb.AdmitRequest(request=request)) in ALLOWED
    assert outcome(stub.Explain, pb.AdmitRequest(request=request)) in ALLOWED
    reserve = pb.ReserveRequest(request=request, gang_id=request.tenant, ttl_s=request.thread_pct)
    assert outcome(stub.Reserve, reserve) in ALLOWED
    assert process.poll() is None


@EXAMPLES
@given(batch=st.lists(requests, max_size=20))
def test_admit_batch(agent: tuple, batch: list[pb.Request]) -> None:  # type: ignore[type-arg]
    stub, _tcp, process = agent
    assert outcome(stub.AdmitBatch, pb.AdmitBatchRequest(requests=batch)) in ALLOWED
    assert process.poll() is None


@EXAMPLES
@given(ident=texts, reason=texts, dry_run=st.booleans(), seq=uint64)
def test_every_other_rpc(agent: tuple, ident: str, reason: str, dry_run: bool, seq: int) -> None:  # type: ignore[type-arg]
    stub, _tcp, process = agent
    for call, request in (
        (stub.Commit, pb.GangRequest(gang_id=ident)),
        (stub.Abort, pb.GangRequest(gang_id=ident)),
        (stub.Release, pb.ReleaseRequest(lease_id=ident)),
        (stub.Drain, pb.DrainRequest(device_uuid=ident, reason=reason)),
        (stub.Undrain, pb.DrainRequest(device_uuid=ident)),
        (stub.ClearStale, pb.ClearStaleRequest(dry_run=dry_run)),
        (stub.ReportProgress, pb.ReportProgressRequest(lease_id=ident, units_done=seq - 1e19)),
        (stub.GetNode, pb.GetNodeRequest()),
    ):
        assert outcome(call, request) in ALLOWED, call
    stub.Undrain(pb.DrainRequest())
    events = stub.WatchEvents(pb.WatchEventsRequest(since_seq=seq), timeout=0.3)
    try:
        for _event in events:
            pass
    except grpc.RpcError as exc:
        # Following (deadline), or a since_seq beyond the last event (refused at once).
        assert exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OUT_OF_RANGE)
    assert process.poll() is None


@EXAMPLES
@given(token=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200))
def test_bad_tokens_are_unauthenticated(agent: tuple, token: str) -> None:  # type: ignore[type-arg]
    _stub, tcp, process = agent
    metadata = (("authorization", f"Bearer {token}"),)
    assert outcome(tcp.GetNode, pb.GetNodeRequest(), metadata=metadata) in (
        grpc.StatusCode.UNAUTHENTICATED,
    )
    assert outcome(tcp.Admit, pb.AdmitRequest(), metadata=metadata) is (
        grpc.StatusCode.UNAUTHENTICATED
    )
    assert process.poll() is None
