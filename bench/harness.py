"""The real agent as a process for the benchmarks (simulated node, a TCP listener with a
token, logs to a file), load generators, the store read back, and hostile requests."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.api.proto import agent_pb2 as pb  # noqa: E402
from agent.api.registration import SERVICE  # noqa: E402
from agent.client import AgentClient, Priority  # noqa: E402
from agent.core.units import GIB  # noqa: E402

TOKEN = "reliability-token-0123456789abcdef"
RESERVE, OVERHEAD = 1 * GIB, GIB // 2  # the default admission.memory_reserve / overhead


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Agent:
    root: Path
    extra: tuple[str, ...] = ()
    tcp_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    entry: tuple[str, ...] = ("-m", "agent")  # or a script that wraps the agent

    @property
    def unix(self) -> str:
        return f"unix:{self.root}/agent.sock"

    def start(self) -> None:
        (self.root / "token").write_text(TOKEN)
        (self.root / "token").chmod(0o600)  # the agent refuses a token others can read
        args = [
            sys.executable, *self.entry, "--socket", str(self.root / "agent.sock"), "serve",
            "--sim", "--http-listen", f"127.0.0.1:{self.http_port}",
            "--tcp-listen", f"127.0.0.1:{self.tcp_port}",
            "--set", f"api.token_file={self.root / 'token'}",
            "--set", "api.insecure_loopback=true",
            "--set", f"paths.runtime_dir={self.root}",
            "--set", f"paths.state_dir={self.root}/state",
            "--set", "mps.probe_interval_s=0.5", "--set", "runtime.on_stop=quit",
            "--log-level", "warning", *self.extra,
        ]  # fmt: skip
        with open(self.root / "agent.log", "ab") as log:
            self.process = subprocess.Popen(
                args,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    async def ready(self, timeout_s: float = 60.0) -> float:
        """Seconds until the agent answers."""
        started = time.monotonic()
        async with AgentClient(self.unix, attempts=1, timeout_s=1) as client:
            while time.monotonic() - started < timeout_s:
                try:
                    await client.ping()
                    return time.monotonic() - started
                except Exception:
                    await asyncio.sleep(0.05)
        raise SystemExit(f"the agent did not come up; see {self.root / 'agent.log'}")

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def stored(self) -> dict[str, tuple[str, str]]:
        """request id -> (lease id, state), read straight from the store."""
        with sqlite3.connect(f"file:{self.root}/state/gpushare.db?mode=ro", uri=True) as db:
            rows = db.execute("SELECT request_id, lease_id, state FROM leases").fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}


@dataclass
class Ledger:
    """What the callers were told: acknowledged admissions and releases, latencies."""

    admitted: dict[str, str] = field(default_factory=dict)  # request id -> lease id
    # request id -> (memory bytes, thread %): a retry must send the same request
    sizes: dict[str, tuple[int, float]] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    latencies_s: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    refused: int = 0


async def callers(target: str, count: int, seconds: float, ledger: Ledger) -> None:
    deadline = time.monotonic() + seconds

    async def one(client: AgentClient) -> None:
        while time.monotonic() < deadline:
            request_id = f"r-{uuid.uuid4().hex}"
            memory_bytes = random.choice((2, 4, 8)) * GIB
            thread_pct = random.choice((5.0, 10.0, 25.0))
            ledger.sizes[request_id] = (memory_bytes, thread_pct)
            started = time.perf_counter()
            try:
                answer = await client.admit(
                    request_id=request_id, tenant="load", trust_domain="load",
                    priority=Priority.BEST_EFFORT, memory_bytes=memory_bytes,
                    thread_pct=thread_pct,
                )  # fmt: skip
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.01)
                continue
            ledger.latencies_s.append(time.perf_counter() - started)
            if not answer.decision.admitted:
                ledger.refused += 1
                continue
            ledger.admitted[request_id] = answer.lease.lease_id
            await asyncio.sleep(random.random() * 0.02)
            try:
                await client.release(answer.lease.lease_id)
                ledger.released.add(answer.lease.lease_id)
            except grpc.aio.AioRpcError:
                pass

    async with AgentClient(target, token=TOKEN, attempts=3, timeout_s=5) as client:
        await asyncio.gather(*(one(client) for _ in range(count)))


async def watch_invariant(target: str, seconds: float, ledger: Ledger) -> None:
    """Committed memory + context overhead + reserve never exceeds a device's memory."""
    deadline = time.monotonic() + seconds
    async with AgentClient(target, attempts=1, timeout_s=2) as client:
        while time.monotonic() < deadline:
            try:
                node = await client.get_node()
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
                continue
            memory = {d.uuid: d.memory_bytes for d in node.devices}
            for entry in node.ledger:
                used = entry.memory_committed_bytes + entry.leases * OVERHEAD + RESERVE
                if entry.leases and used > memory[entry.device_uuid]:
                    ledger.violations.append(f"{entry.device_uuid}: {used} > capacity")
            await asyncio.sleep(0.05)


def audit(agent: Agent, ledger: Ledger) -> dict[str, int]:
    """Acknowledged leases missing from the store, and request ids stored twice."""
    stored = agent.stored()
    lost = sum(
        1 for request, lease in ledger.admitted.items() if stored.get(request, ("",))[0] != lease
    )
    leases = [lease for lease, _state in stored.values()]
    return {"lost": lost, "duplicated": len(leases) - len(set(leases))}


# -- hostile requests ----------------------------------------------------------------------


def hostile_requests(count: int, seed: int) -> list[tuple[str, bytes]]:
    """(method, serialized request) pairs: garbage bytes, huge and control-character
    strings, negative, overflowing and non-finite numbers, unknown enum values."""
    rng = random.Random(seed)
    methods = [m.name for m in SERVICE.methods if not m.server_streaming]
    words = ["", "a" * 100_000, "\x00\x01", "é" * 200, "../../etc/passwd", "ok", "x" * 129]
    numbers = [-1.0, 0.0, 1e308, float("inf"), float("nan"), -1e-300, 100.0001, 2.0**64]
    out = []
    for _ in range(count):
        method = rng.choice(methods)
        kind = rng.random()
        if kind < 0.25:
            out.append((method, bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))))
            continue
        request = pb.Request(
            request_id=rng.choice(words), tenant=rng.choice(words), trust_domain=rng.choice(words),
            priority=rng.choice([0, 1, 2, 3, 7, 2**31 - 1]), thread_pct=rng.choice(numbers),
            retention_floor=rng.choice(numbers), profile=rng.choice(words),
            memory_bytes=rng.choice([0, 1, 2**63, 2**64 - 1, 512 * GIB]),
            gpu_model=rng.choice(words),
            job=pb.Job(job_type=rng.choice(words), requested_gpus=rng.choice(numbers),
                       declared_duration_s=rng.choice(numbers)),
        )  # fmt: skip
        if rng.random() < 0.3:
            request.counters[rng.choice(words) or "k"] = rng.choice(numbers)
        message = {
            "Admit": lambda r=request: pb.AdmitRequest(request=r),
            "Explain": lambda r=request: pb.AdmitRequest(request=r),
            "AdmitBatch": lambda r=request: pb.AdmitBatchRequest(requests=[r] * rng.randint(0, 3)),
            "Reserve": lambda r=request: pb.ReserveRequest(
                request=r, gang_id=rng.choice(words), ttl_s=rng.choice(numbers)
            ),
            "Commit": lambda: pb.GangRequest(gang_id=rng.choice(words)),
            "Abort": lambda: pb.GangRequest(gang_id=rng.choice(words)),
            "Release": lambda: pb.ReleaseRequest(lease_id=rng.choice(words)),
            "Drain": lambda: pb.DrainRequest(
                device_uuid=rng.choice(words), reason=rng.choice(words)
            ),
            "Undrain": lambda: pb.DrainRequest(device_uuid=rng.choice(words)),
            "ClearStale": lambda: pb.ClearStaleRequest(dry_run=True),
            "ReportProgress": lambda: pb.ReportProgressRequest(
                lease_id=rng.choice(words), units_done=rng.choice(numbers)
            ),
            "RetrainEstimator": pb.RetrainEstimatorRequest,
            "AnswerClaim": lambda: pb.AnswerClaimRequest(
                claim_json=rng.choice(words).encode(errors="replace")
            ),
            "GetNode": pb.GetNodeRequest,
            "Ping": pb.PingRequest,
        }[method]()
        out.append((method, message.SerializeToString()))
    return out


async def send_hostile(
    target: str, requests: list[tuple[str, bytes]], token: str | None
) -> dict[str, int]:
    codes: dict[str, int] = {}
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    async with grpc.aio.insecure_channel(target) as channel:
        for method, payload in requests:
            call = channel.unary_unary(f"/{SERVICE.full_name}/{method}", lambda b: b, lambda b: b)
            try:
                await call(payload, timeout=5, metadata=metadata)
                code = "OK"
            except grpc.aio.AioRpcError as error:
                code = error.code().name
            codes[code] = codes.get(code, 0) + 1
    return codes
