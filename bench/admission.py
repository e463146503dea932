"""Admission latency and throughput of the real agent, against a no-op RPC on the same server.

Starts `gpushare serve --sim` (4 x H100) with a TCP listener and a bearer token, then, for
1, 8 and 64 concurrent callers, measures in one run:

- `Admit` (each admitted lease released again right after, so the node never fills up):
  latency of the Admit call alone, admissions per second;
- `Ping`, a no-op RPC through the same listener, interceptor and event loop: the floor.

Every admission is durable (SQLite WAL, synchronous=FULL, group commit) before it is
answered. The ratio of the two p50 latencies is what admission costs above gRPC itself.

Then, on the same agent, the cost of WatchEvents (the streams are read by a process of
their own, bench/watchers.py, over loopback TCP, 25 streams to a connection):

- `admit_p50_ms_1_watchers_0` and `_N`: Admit p50 at one caller (admit + release pairs, as
  above) for `--seconds`, first with no watcher, then with `--watchers` (500) live
  followers (since_seq = the last seq) that read every event; `watchers_p50_ratio` is
  with / without (target <= 2). The `_0` figure is measured again, just before the `_N`
  one, the same way as `admit_p50_ms_1`.
- catch-up: 32 callers run admit + release pairs (two events each) until the store holds
  `--events` (100,000 = admission.max_events, set to the same), then
  `--catchup-watchers` (50) read from since_seq=0 to the last seq while one caller
  admits: `admit_max_ms_during_catchup` (target < 50), `catchup_s`, and the agent's RSS
  before and after (`rss_growth_mib`, target < 100).

A watcher ended with RESOURCE_EXHAUSTED resumes after its last event and is counted;
every watcher stops at the last event or its deadline. `--no-watchers` skips all this.

    python bench/admission.py [--seconds 5] [--sync full|normal] [--no-watchers]

Takes about 30 s with --no-watchers, 4 to 8 min without it on a 2-core machine (most of
it the fill and the catch-up). Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

FILL_CALLERS = 32
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from harness import TOKEN, Agent  # noqa: E402
from watchers import WatcherProcess  # noqa: E402

from agent.client import AgentClient, Priority  # noqa: E402


def start_agent(root: Path, sync: str, max_events: int) -> Agent:
    agent = Agent(
        root,
        ("--set", "mps.probe_interval_s=3600", "--set", f"paths.state_sync={sync}",
         "--set", f"admission.max_events={max_events}"),
    )  # fmt: skip
    agent.start()
    return agent


def for_seconds(seconds: float) -> Callable[[], bool]:
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


async def run_callers(
    target: str, callers: int, seconds: float | Callable[[], bool], kind: str
) -> list[float]:
    """Latencies of `kind` calls by `callers` concurrent callers for `seconds`, or until
    `seconds()` is true; on one warmed-up channel (its connection is not timed)."""
    latencies: list[float] = []
    stop = for_seconds(seconds) if isinstance(seconds, int | float) else seconds

    async def caller(agent: AgentClient) -> None:
        while not stop():
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
        await agent.ping()
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


async def last_seq(target: str) -> int:
    async with AgentClient(target, token=TOKEN) as agent:
        return int((await agent.get_node()).last_event_seq)


def rss_mib(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


async def live_watchers(target: str, seconds: float, count: int, rpc: str) -> dict[str, Any]:
    """Admit p50 at one caller with no watchers, then with `count` live followers."""
    result: dict[str, Any] = {}
    for n in (0, count):
        watchers = None
        if n:
            since = await last_seq(target)
            watchers = WatcherProcess(target, n, since, deadline_s=seconds + 120, rpc=rpc)
            await watchers.start()
            await watchers.wait_for("started")
            await watchers.wait_for("ready")
        admit = await run_callers(target, 1, seconds, "admit")
        result[f"admit_p50_ms_1_watchers_{n}"] = pct(admit, 0.5)
        result[f"admit_p99_ms_1_watchers_{n}"] = pct(admit, 0.99)
        result[f"admits_per_s_1_watchers_{n}"] = len(admit) / seconds
        if watchers is None:
            continue
        until = await last_seq(target)
        await watchers.stop_at(until)
        seen = await watchers.result()
        result[f"watcher_events_{n}"] = seen["events"]
        result[f"watcher_events_expected_{n}"] = n * (until - since)
        result[f"watchers_reached_end_{n}"] = seen["reached"]
        result[f"watchers_end_lag_s_{n}"] = seen["done_s_after_until"]
        for key in ("gaps", "resource_exhausted", "errors"):
            result[f"watcher_{key}_{n}"] = seen[key]
        if seen["error_samples"]:
            print(f"watcher errors: {seen['error_samples']}", file=sys.stderr)
    result["watchers_p50_ratio"] = (
        result[f"admit_p50_ms_1_watchers_{count}"] / result["admit_p50_ms_1_watchers_0"]
    )
    return result


async def fill(target: str, events: int) -> dict[str, Any]:
    """Admit + release pairs (two events each) at FILL_CALLERS until `events` are stored."""
    started = time.monotonic()
    full = asyncio.Event()

    async def monitor() -> None:
        shown = 0.0
        while (seq := await last_seq(target)) < events:
            if time.monotonic() - shown >= 10:
                shown = time.monotonic()
                print(f"fill: {seq} / {events} events, {shown - started:.0f} s", file=sys.stderr)
            await asyncio.sleep(0.5)
        full.set()

    await asyncio.gather(monitor(), run_callers(target, FILL_CALLERS, full.is_set, "admit"))
    return {"fill_s": time.monotonic() - started, "fill_last_seq": await last_seq(target)}


async def catchup(target: str, pid: int, count: int, timeout_s: float, rpc: str) -> dict[str, Any]:
    """`count` watchers from since_seq=0 read to the last event, while one caller admits."""
    result: dict[str, Any] = {"agent_rss_mib_before_catchup": rss_mib(pid)}
    until = await last_seq(target)
    watchers = WatcherProcess(target, count, 0, deadline_s=timeout_s, rpc=rpc)
    await watchers.start(until=until)
    await watchers.wait_for("started")
    peak = result["agent_rss_mib_before_catchup"]
    done = asyncio.Event()

    async def sample_rss() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.2)

    admits = asyncio.create_task(run_callers(target, 1, done.is_set, "admit"))
    sampler = asyncio.create_task(sample_rss())
    try:
        seen = await watchers.result()
    finally:
        done.set()
    admit = await admits
    await sampler
    result["agent_rss_mib_after_catchup"] = rss_mib(pid)
    result["agent_rss_mib_peak_during_catchup"] = peak
    result["rss_growth_mib"] = (
        result["agent_rss_mib_after_catchup"] - result["agent_rss_mib_before_catchup"]
    )
    result["admit_max_ms_during_catchup"] = max(admit) * 1000
    result["admit_p50_ms_during_catchup"] = pct(admit, 0.5)
    result["admit_p99_ms_during_catchup"] = pct(admit, 0.99)
    result["admits_during_catchup"] = len(admit)
    result["catchup_s"] = seen["done_s"]
    result["catchup_watchers"] = count
    result["catchup_events_each"] = until - seen["first_seq"] + 1
    result["catchup_reached"] = seen["reached"]
    for key in ("gaps", "resource_exhausted", "errors"):
        result[f"catchup_{key}"] = seen[key]
    if seen["error_samples"]:
        print(f"catch-up watcher errors: {seen['error_samples']}", file=sys.stderr)
    return result


async def run_all(target: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = await measure(target, args.seconds, pid)
    if args.no_watchers:
        return result
    result["watch_rpc"] = args.watch_rpc
    result.update(await live_watchers(target, args.seconds, args.watchers, args.watch_rpc))
    result.update(await fill(target, args.events))
    result.update(
        await catchup(target, pid, args.catchup_watchers, args.catchup_timeout_s, args.watch_rpc)
    )
    return result


def log_tail(root: Path, lines: int = 5) -> int:
    """Prints the agent log's last lines to stderr; returns how many lines it has."""
    log = (root / "agent.log").read_text(errors="replace").splitlines()
    for line in log[-lines:]:
        print(f"agent.log: {line}", file=sys.stderr)
    return len(log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument(
        "--sync",
        choices=("full", "normal"),
        default="full",
        help="paths.state_sync of the agent under test",
    )
    parser.add_argument(
        "--no-watchers", action="store_true", help="skip the WatchEvents measurements"
    )
    parser.add_argument("--watchers", type=int, default=500, help="live followers")
    parser.add_argument("--events", type=int, default=100_000, help="stored before catch-up")
    parser.add_argument("--catchup-watchers", type=int, default=50)
    parser.add_argument(
        "--watch-rpc",
        choices=("batches", "events"),
        default="batches",
        help="WatchEventBatches (a message per window) or WatchEvents (one per event)",
    )
    parser.add_argument("--catchup-timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gs-adm-", dir="/tmp") as tmp:
        agent = start_agent(Path(tmp), args.sync, args.events)
        try:
            asyncio.run(agent.ready())
            assert agent.process is not None
            target = f"127.0.0.1:{agent.tcp_port}"
            result = asyncio.run(run_all(target, agent.process.pid, args))
        finally:
            agent.stop()
            result_log = log_tail(Path(tmp))
    result["agent_log_lines"] = result_log
    result["bench_s"] = time.monotonic() - started
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
    print(
        f"p50 ratio (admit / no-op, 1 caller): {result['p50_ratio']:.2f} "
        "(target <= 2.0 with state_sync=full)"
    )
    print(
        f"agent CPU at 64 callers: {result['server_cpu_ms_per_noop_64']:.2f} ms per no-op, "
        f"{result['server_cpu_ms_per_admit_release_64']:.2f} ms per admit + release"
    )
    if not args.no_watchers:
        print_watchers(result, args.watchers)
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
    print(json.dumps({"sync": args.sync, **rounded}))


def print_watchers(result: dict[str, Any], count: int) -> None:
    print(
        f"admit p50 at 1 caller: {result['admit_p50_ms_1_watchers_0']:.2f} ms without watchers, "
        f"{result[f'admit_p50_ms_1_watchers_{count}']:.2f} ms with {count} live watchers: "
        f"ratio {result['watchers_p50_ratio']:.2f} (target <= 2); watchers got "
        f"{result[f'watcher_events_{count}']} of {result[f'watcher_events_expected_{count}']} "
        f"events, {result[f'watcher_resource_exhausted_{count}']} RESOURCE_EXHAUSTED, "
        f"{result[f'watcher_errors_{count}']} errors"
    )
    print(
        f"filled to {result['fill_last_seq']} events in {result['fill_s']:.0f} s; "
        f"{result['catchup_watchers']} watchers caught up {result['catchup_events_each']} "
        f"events each in {result['catchup_s'] or float('nan'):.1f} s "
        f"({result['catchup_reached']} reached the end, "
        f"{result['catchup_resource_exhausted']} RESOURCE_EXHAUSTED, "
        f"{result['catchup_errors']} errors)"
    )
    print(
        f"admit during catch-up: max {result['admit_max_ms_during_catchup']:.1f} ms "
        f"(target < 50), p50 {result['admit_p50_ms_during_catchup']:.2f} ms; agent RSS "
        f"{result['agent_rss_mib_before_catchup']:.0f} -> "
        f"{result['agent_rss_mib_after_catchup']:.0f} MiB (peak "
        f"{result['agent_rss_mib_peak_during_catchup']:.0f}; target growth < 100)"
    )


if __name__ == "__main__":
    main()
