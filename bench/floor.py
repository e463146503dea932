"""Where an admission's cost goes: the real agent against the same agent whose Admit and
Release give back a canned answer of the same size, measured side by side in one run.

For each variant (`real`, `identify`: canned answers but the caller identified at every
call, `canned`: canned answers alone) it starts `gpushare serve --sim` with a TCP listener
and a bearer token, and measures like bench/admission.py: agent CPU per admit-and-release
pair and per no-op RPC at 64 callers, and Admit and no-op p50 at one caller. The canned
variants are the floor that gRPC, the listener and the interceptor set for two calls of
these sizes; `real` minus `identify` is what the admission itself costs.

    python bench/floor.py [--seconds 5]

Takes about a minute. Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from admission import pct, run_callers, server_cpu_s
from harness import Agent

CANNED = (str(Path(__file__).resolve().parent / "canned_agent.py"),)
VARIANTS = ("real", "identify", "canned")


async def cpu_ms_per_call(target: str, pid: int, seconds: float, kind: str) -> float:
    await run_callers(target, 64, 1, kind)  # warm up
    before = server_cpu_s(pid)
    calls = await run_callers(target, 64, seconds, kind)
    return 1000 * (server_cpu_s(pid) - before) / max(1, len(calls))


async def measure(variant: str, seconds: float) -> dict[str, float]:
    os.environ["GPUSHARE_BENCH_CANNED"] = variant
    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(
            Path(tmp), ("--set", "mps.probe_interval_s=3600"),
            entry=("-m", "agent") if variant == "real" else CANNED,
        )  # fmt: skip
        agent.start()
        try:
            await agent.ready()
            assert agent.process is not None
            target, pid = f"127.0.0.1:{agent.tcp_port}", agent.process.pid
            noop_cpu = await cpu_ms_per_call(target, pid, seconds, "ping")
            pair_cpu = await cpu_ms_per_call(target, pid, seconds, "admit")
            noop = await run_callers(target, 1, seconds, "ping")
            admit = await run_callers(target, 1, seconds, "admit")
        finally:
            agent.stop()
    return {
        f"{variant}_cpu_ms_per_noop_64": noop_cpu,
        f"{variant}_cpu_ms_per_admit_release_64": pair_cpu,
        f"{variant}_cpu_ratio": pair_cpu / noop_cpu,
        f"{variant}_p50_ratio": pct(admit, 0.5) / pct(noop, 0.5),
    }


async def main(seconds: float) -> dict[str, float]:
    result: dict[str, float] = {}
    for variant in VARIANTS:
        result.update(await measure(variant, seconds))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    result = asyncio.run(main(parser.parse_args().seconds))
    print(f"{'variant':>9} {'CPU/no-op':>10} {'CPU/pair':>9} {'CPU ratio':>10} {'p50 ratio':>10}")
    for variant in VARIANTS:
        print(
            f"{variant:>9} {result[f'{variant}_cpu_ms_per_noop_64']:>8.3f}ms "
            f"{result[f'{variant}_cpu_ms_per_admit_release_64']:>7.3f}ms "
            f"{result[f'{variant}_cpu_ratio']:>10.2f} {result[f'{variant}_p50_ratio']:>10.2f}"
        )
    print(json.dumps({k: round(v, 3) for k, v in result.items()}))
