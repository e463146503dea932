"""Reliability of the real agent (simulated node, real MPS control binary when installed):
load, faults and hostile input, in one run.

- load: concurrent scheduler clients admit and release for a while; leases lost or
  duplicated (against the SQLite store) and memory-invariant violations (checked
  continuously through GetNode) must all be 0;
- faults: kill -9 of the agent under load, again and again (every acknowledged lease must
  survive each restart); SIGTERM restarts under load with a job connected to each device's
  MPS server (bench/graceful.py: no daemon replaced, no client cut off, nothing lost);
  kill -9 of MPS control daemons (the supervisor restarts them; the
  device refuses leases meanwhile); the telemetry endpoint gone and back; the state
  directory made read-only and writable again (admissions must fail closed, then recover);
- bad input: malformed and hostile requests across every RPC, with good, bad and no tokens:
  crashes and INTERNAL / UNKNOWN answers must be 0;
- security (bench/security.py): calls without credentials, plaintext tokens, another
  caller's releases, forged process identities and world-writable files: each count 0.

    python bench/reliability.py            # the full run (about 5 minutes)
    python bench/reliability.py --small    # the CI size (about 1 minute)

Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graceful import restarts_graceful
from harness import (
    TOKEN,
    Agent,
    Ledger,
    audit,
    callers,
    hostile_requests,
    send_hostile,
    watch_invariant,
)
from security import SECURITY_COUNTS, security

from agent.client import AgentClient
from agent.sim.node import SimNodeSpec

FULL = {"load_s": 60, "callers": 64, "restarts": 20, "mps_kills": 5, "hostile": 10_000}
SMALL = {"load_s": 5, "callers": 16, "restarts": 3, "mps_kills": 2, "hostile": 1_000}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


async def load(root: Path, size: dict[str, int]) -> dict[str, Any]:
    agent = Agent(root)
    agent.start()
    await agent.ready()
    ledger = Ledger()
    seconds = size["load_s"]
    await asyncio.gather(
        callers(f"127.0.0.1:{agent.tcp_port}", size["callers"], seconds, ledger),
        watch_invariant(agent.unix, seconds, ledger),
    )
    agent.stop()
    return {
        "admitted": len(ledger.admitted),
        "released": len(ledger.released),
        "refused": ledger.refused,
        **audit(agent, ledger),
        "invariant_violations": len(ledger.violations),
        "p50_ms": round(pct(ledger.latencies_s, 0.5), 2),
        "p99_ms": round(pct(ledger.latencies_s, 0.99), 2),
    }


async def restarts(root: Path, size: dict[str, int]) -> dict[str, Any]:
    agent = Agent(root)
    ledger = Ledger()
    recovery: list[float] = []
    for _ in range(size["restarts"]):
        agent.start()
        recovery.append(await agent.ready())
        burst = asyncio.create_task(
            callers(f"127.0.0.1:{agent.tcp_port}", size["callers"], 5.0, ledger)
        )
        await asyncio.sleep(random.uniform(0.5, 1.5))
        agent.kill9()
        await burst
    agent.start()
    recovery.append(await agent.ready())
    same = await retried_ids_answer_the_same(agent, ledger)
    agent.stop()
    return {
        "kill9_restarts": size["restarts"],
        "acknowledged": len(ledger.admitted),
        **audit(agent, ledger),
        "retries_same_lease": same,
        "recovery_s_max": round(max(recovery), 2),
    }


async def retried_ids_answer_the_same(agent: Agent, ledger: Ledger) -> str:
    """A retried request id gets its lease back, or FAILED_PRECONDITION if the store says
    that lease has ended (released just before a kill, say)."""
    stored = agent.stored()
    checked = good = 0
    async with AgentClient(f"127.0.0.1:{agent.tcp_port}", token=TOKEN, attempts=1) as client:
        for request_id, lease in list(ledger.admitted.items())[:40]:
            checked += 1
            memory_bytes, thread_pct = ledger.sizes[request_id]
            try:
                answer = await client.admit(
                    request_id=request_id, tenant="load", trust_domain="load", priority=3,
                    memory_bytes=memory_bytes, thread_pct=thread_pct,
                )  # fmt: skip
                good += answer.lease.lease_id == lease
            except grpc.aio.AioRpcError as error:
                ended = stored.get(request_id, ("", "admitted"))[1] not in ("admitted", "ready")
                good += error.code() is grpc.StatusCode.FAILED_PRECONDITION and ended
    return f"{good}/{checked}"


async def mps_kills(root: Path, size: dict[str, int]) -> dict[str, Any]:
    agent = Agent(root)
    agent.start()
    await agent.ready()
    recovery, closed = [], 0
    async with AgentClient(agent.unix, attempts=1, timeout_s=5) as client:
        for _ in range(size["mps_kills"]):
            node = await client.get_node()
            daemon = random.choice([m for m in node.mps if m.up and m.pid])
            started = time.monotonic()
            os.kill(daemon.pid, signal.SIGKILL)
            seen_closed = False
            while time.monotonic() - started < 60:
                node = await client.get_node()
                state = next(m for m in node.mps if m.device_uuid == daemon.device_uuid)
                if not state.up:
                    explain = await client.explain(
                        tenant="t", trust_domain="t", priority=3, memory_bytes=2**30,
                        thread_pct=1.0,
                    )  # fmt: skip
                    attempt = next(
                        a for a in explain.decision.attempts if a.device_uuid == daemon.device_uuid
                    )
                    seen_closed = seen_closed or attempt.reason == "DEVICE_UNAVAILABLE"
                if state.up and state.pid != daemon.pid:
                    break
                await asyncio.sleep(0.05)
            recovery.append(time.monotonic() - started)
            closed += seen_closed
    agent.stop()
    return {
        "mps_kill9": size["mps_kills"],
        "mps_recovery_s_max": round(max(recovery), 2),
        "refused_while_down": f"{closed}/{size['mps_kills']} outages seen closed",
    }


async def exporter(text: str, port: int = 0) -> tuple[web.AppRunner, int]:
    """A stand-in dcgm-exporter on loopback serving ``text``."""
    app = web.Application()
    app.router.add_get("/metrics", lambda _r: web.Response(text=text))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return runner, port or site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def telemetry_gone(root: Path) -> dict[str, Any]:
    uuids = [d.uuid for d in SimNodeSpec.default().devices]
    text = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="{u}",device="nvidia{i}",modelName="H100"}} 5\n'
        for i, u in enumerate(uuids)
    )
    runner, port = await exporter(text)
    settings = {
        "telemetry.source": "exporter",
        "telemetry.exporter_url": f"http://127.0.0.1:{port}/metrics",
        "telemetry.sample_interval_s": "0.2",
        "telemetry.window_s": "1",
        "telemetry.stale_after_s": "1",
    }
    agent = Agent(root, tuple(a for k, v in settings.items() for a in ("--set", f"{k}={v}")))
    agent.start()
    await agent.ready()
    ready_url = f"http://127.0.0.1:{agent.http_port}/readyz"
    async with aiohttp.ClientSession() as http:
        before = await until_status(http, ready_url, 200, 30)
        await runner.cleanup()  # the endpoint is gone, open connections too
        to_unready = await until_status(http, ready_url, 503, 30)
        runner, _ = await exporter(text, port)
        to_ready = await until_status(http, ready_url, 200, 30)
    agent.stop()
    await runner.cleanup()
    return {
        "telemetry_ready_at_start": before is not None,
        "telemetry_gone_to_unready_s": to_unready,
        "telemetry_back_to_ready_s": to_ready,
    }


async def until_status(
    http: aiohttp.ClientSession, url: str, status: int, timeout_s: float
) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            async with http.get(url) as response:
                if response.status == status:
                    return round(time.monotonic() - started, 2)
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    return None


async def sh(*command: str) -> int:
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, check=False)
    return done.returncode


async def unwritable_store(root: Path) -> dict[str, Any]:
    """The state directory's file system stops taking writes, then takes them again. (A
    read-only remount is refused while the store holds its files open, so the file system
    is filled instead: the store meets a failed write either way.)"""
    state = root / "state"
    state.mkdir()
    if await sh("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(state)) != 0:
        return {"unwritable_store": "skipped: cannot mount a file system here (needs root)"}
    agent = Agent(root)
    filler = state / "filler"
    try:
        agent.start()
        await agent.ready()
        async with AgentClient(agent.unix, attempts=1, timeout_s=5) as client:
            ask = dict(tenant="t", trust_domain="t", priority=3, memory_bytes=2**30, thread_pct=1.0)
            assert (await client.admit(**ask)).decision.admitted
            await sh("dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=64")  # until full
            answers = [(await client.admit(**ask)).decision for _ in range(20)]
            refused = [d for d in answers if not d.admitted]
            failed_closed = bool(refused) and all(d.reason == "STORE_UNAVAILABLE" for d in refused)
            filler.unlink()
            started = time.monotonic()
            for _ in range(600):
                if (await client.admit(**ask)).decision.admitted:
                    break
                await asyncio.sleep(0.1)
            recovered = time.monotonic() - started
            node = await client.get_node()
    finally:
        agent.stop()
        await sh("umount", "-l", str(state))
    return {
        "unwritable_fails_closed": failed_closed,
        "unwritable_refused": f"{len(refused)}/{len(answers)}",
        "unwritable_recovery_s": round(recovered, 2),
        "leases_after": len(node.leases),
    }


async def bad_input(root: Path, size: dict[str, int]) -> dict[str, Any]:
    agent = Agent(root)
    agent.start()
    await agent.ready()
    requests = hostile_requests(size["hostile"], seed=7)
    third = len(requests) // 3
    target = f"127.0.0.1:{agent.tcp_port}"
    codes: dict[str, int] = {}
    for part, token in ((requests[:third], TOKEN), (requests[third : 2 * third], "wrong"),
                        (requests[2 * third :], None)):  # fmt: skip
        for code, n in (await send_hostile(target, part, token)).items():
            codes[code] = codes.get(code, 0) + n
    unix = await send_hostile(agent.unix, requests[:third], None)  # admin RPCs allowed here
    for code, n in unix.items():
        codes[code] = codes.get(code, 0) + n
    alive = agent.process is not None and agent.process.poll() is None
    exit_code = agent.stop()
    return {
        "hostile_requests": sum(codes.values()),
        "answers": dict(sorted(codes.items())),
        "internal_or_unknown": codes.get("INTERNAL", 0) + codes.get("UNKNOWN", 0),
        "crashes": int(not alive) + int(exit_code not in (0, -signal.SIGTERM)),
    }


async def main_async(size: dict[str, int]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    steps = (
        ("load", lambda r: load(r, size)),
        ("restarts", lambda r: restarts(r, size)),
        ("restarts_graceful", lambda r: restarts_graceful(r, size)),
        ("mps", lambda r: mps_kills(r, size)),
        ("telemetry", telemetry_gone),
        ("unwritable", unwritable_store),
        ("bad_input", lambda r: bad_input(r, size)),
        ("security", security),
    )
    for name, step in steps:
        with tempfile.TemporaryDirectory(prefix="gs-rel-", dir="/tmp") as tmp:
            started = time.monotonic()
            print(f"{name} ...", file=sys.stderr)
            result[name] = await step(Path(tmp))
            print(f"{name}: {time.monotonic() - started:.1f} s {result[name]}", file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the CI size")
    args = parser.parse_args()
    size = SMALL if args.small else FULL
    result = asyncio.run(main_async(size))
    ok = (
        result["load"]["lost"] == result["load"]["duplicated"] == 0
        and result["load"]["invariant_violations"] == 0
        and result["restarts"]["lost"] == result["restarts"]["duplicated"] == 0
        and result["restarts_graceful"]["mps_daemons_replaced"] == 0
        and result["restarts_graceful"]["clients_cut_off"] == 0
        and result["restarts_graceful"]["lost"] == result["restarts_graceful"]["duplicated"] == 0
        and result["bad_input"]["internal_or_unknown"] == result["bad_input"]["crashes"] == 0
        and all(result["security"][key] == 0 for key in SECURITY_COUNTS)
    )
    for name, values in result.items():
        print(f"{name:<10} " + ", ".join(f"{k}={v}" for k, v in values.items()))
    print(json.dumps({"size": "small" if args.small else "full", "ok": ok, **result}))


if __name__ == "__main__":
    main()
