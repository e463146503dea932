"""Admission latency and throughput of the real agent, against a no-op RPC on the same server.

Starts `gpushare serve --sim` (4 x H100) with a TCP listener and a bearer token, then, for
1, 8 and 64 concurrent callers, measures in one run:

- `Admit` (each admitted lease released again right after, so the node never fills up):
  latency of the Admit call alone, admissions per second;
- `Ping`, a no-op RPC through the same listener, interceptor and event loop: the floor.

Every admission is durable (SQLite WAL, synchronous=FULL, group commit) before it is
answered. The ratio of the two p50 latencies is what admission costs above gRPC itself.

    python bench/admission.py [--seconds 5]

Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from harness import TOKEN, Agent  # noqa: E402

from agent.client import AgentClient, Priority  # noqa: E402


def start_agent(root: Path, sync: str) -> Agent:
    agent = Agent(
        root,
        ("--set", "mps.probe_interval_s=3600", "--set", f"paths.state_sync={sync}"),
    )
    agent.start()
    return agent


async def run_callers(target: str, callers: int, seconds: float, kind: str) -> list[float]:
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def caller(agent: AgentClient) -> None:
        while time.monotonic() < deadline:
            if kind == "ping":
                started = time.perf_counter()
                await agent.ping()
                latencies.append(time.perf_counter() - started)
                continue
            started = time.perf_counter()
            answer = await agent.admit(
                request_id=f"b-{uuid.uuid4().hex}",
                tenant="bench",
                trust_domain="bench",
                priority=Priority.BEST_EFFORT,
                memory_bytes=64 * 2**20,
                thread_pct=1.0,
            )
            latencies.append(time.perf_counter() - started)
            if not answer.decision.admitted:
                raise SystemExit(f"refused: {answer.decision.message}")
            await agent.release(answer.lease.lease_id)

    async with AgentClient(target, token=TOKEN) as agent:
        await asyncio.gather(*(caller(agent) for _ in range(callers)))
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def server_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def measure(target: str, seconds: float, pid: int) -> dict[str, float]:
    result: dict[str, float] = {}
    for callers in (1, 8, 64):
        cpu_before = server_cpu_s(pid)
        noop = await run_callers(target, callers, seconds, "ping")
        cpu_between = server_cpu_s(pid)
        admit = await run_callers(target, callers, seconds, "admit")
        cpu_after = server_cpu_s(pid)
        result[f"server_cpu_ms_per_noop_{callers}"] = (
            1000 * (cpu_between - cpu_before) / max(1, len(noop))
        )
        result[f"server_cpu_ms_per_admit_release_{callers}"] = (
            1000 * (cpu_after - cpu_between) / max(1, len(admit))
        )
        result[f"noop_p50_ms_{callers}"] = pct(noop, 0.5)
        result[f"admit_p50_ms_{callers}"] = pct(admit, 0.5)
        result[f"admit_p99_ms_{callers}"] = pct(admit, 0.99)
        result[f"admits_per_s_{callers}"] = len(admit) / seconds
        result[f"noops_per_s_{callers}"] = len(noop) / seconds
    result["admit_p50_ms"] = result["admit_p50_ms_1"]
    result["noop_p50_ms"] = result["noop_p50_ms_1"]
    result["p50_ratio"] = result["admit_p50_ms"] / result["noop_p50_ms"]
    result["admit_p99_ms"] = result["admit_p99_ms_1"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument(
        "--sync",
        choices=("full", "normal"),
        default="full",
        help="paths.state_sync of the agent under test",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gs-adm-", dir="/tmp") as tmp:
        agent = start_agent(Path(tmp), args.sync)
        try:
            asyncio.run(agent.ready())
            assert agent.process is not None
            target = f"127.0.0.1:{agent.tcp_port}"
            result = asyncio.run(measure(target, args.seconds, agent.process.pid))
        finally:
            agent.stop()
    print(
        f"{'callers':>8} {'admit p50':>10} {'admit p99':>10} {'noop p50':>9} "
        f"{'admits/s':>9} {'noops/s':>8}"
    )
    for callers in (1, 8, 64):
        print(
            f"{callers:>8} {result[f'admit_p50_ms_{callers}']:>9.2f}m "
            f"{result[f'admit_p99_ms_{callers}']:>9.2f}m {result[f'noop_p50_ms_{callers}']:>8.2f}m "
            f"{result[f'admits_per_s_{callers}']:>9.0f} {result[f'noops_per_s_{callers}']:>8.0f}"
        )
    print(f"p50 ratio (admit / no-op, 1 caller): {result['p50_ratio']:.2f} (target <= 1.5)")
    print(
        f"agent CPU at 64 callers: {result['server_cpu_ms_per_noop_64']:.2f} ms per no-op, "
        f"{result['server_cpu_ms_per_admit_release_64']:.2f} ms per admit + release"
    )
    print(json.dumps({"sync": args.sync, **{k: round(v, 3) for k, v in result.items()}}))


if __name__ == "__main__":
    main()
