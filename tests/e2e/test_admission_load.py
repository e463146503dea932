"""The real daemon under concurrent admissions, and killed with -9 in the middle of a burst.

The soak length is GPUSHARE_SOAK_S seconds (default 5 in the test suite; the issue's
figure is measured with 30)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.client import AgentClient, Priority
from agent.core.units import GIB
from tests.helpers import short_dir, spawn_agent

SOAK_S = float(os.environ.get("GPUSHARE_SOAK_S", "5"))
RESERVE = 1 * GIB
OVERHEAD = GIB // 2


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def start(root: Path) -> subprocess.Popen[bytes]:
    return spawn_agent(root, "--set", "mps.probe_interval_s=60")


async def ready(target: str) -> None:
    async with AgentClient(target, attempts=1, timeout_s=1) as agent:
        for _ in range(150):
            try:
                await agent.ping()
                return
            except Exception:
                await asyncio.sleep(0.1)
    raise AssertionError("the agent did not come up")


def check_invariant(node: object) -> list[str]:
    """Committed memory + context overhead + reserve never exceeds a device's memory."""
    memory = {d.uuid: d.memory_bytes for d in node.devices}  # type: ignore[attr-defined]
    return [
        f"{entry.device_uuid}: {entry.memory_committed_bytes} + overhead over capacity"
        for entry in node.ledger  # type: ignore[attr-defined]
        if entry.memory_committed_bytes + entry.leases * OVERHEAD + RESERVE
        > memory[entry.device_uuid]
    ]


def stored_leases(root: Path) -> dict[str, tuple[str, str]]:
    with sqlite3.connect(root / "state" / "gpushare.db") as db:
        rows = db.execute("SELECT request_id, lease_id, state FROM leases").fetchall()
    return {request_id: (lease_id, state) for request_id, lease_id, state in rows}


async def caller(
    agent: AgentClient, deadline: float, acknowledged: dict[str, str], refused: list[str]
) -> None:
    """Admit a random size, hold it a moment, release it; refusals are fine and counted."""
    rng = random.Random()
    while time.monotonic() < deadline:
        request_id = f"c-{rng.getrandbits(64):x}"
        answer = await agent.admit(
            request_id=request_id,
            tenant="t",
            trust_domain="load",
            priority=Priority.BURSTABLE,
            memory_bytes=rng.randint(1, 30) * GIB,
            thread_pct=rng.choice([5.0, 10.0, 25.0]),
        )
        if not answer.decision.admitted:
            refused.append(answer.decision.reason)
            continue
        acknowledged[request_id] = answer.lease.lease_id
        await asyncio.sleep(rng.random() * 0.2)
        await agent.release(answer.lease.lease_id)


async def test_64_callers_never_overcommit_and_every_lease_is_stored(root: Path) -> None:
    agent_process = start(root)
    target = f"unix:{root / 'agent.sock'}"
    try:
        await ready(target)
        acknowledged: dict[str, str] = {}
        refused: list[str] = []
        violations: list[str] = []
        checks = 0
        deadline = time.monotonic() + SOAK_S
        async with AgentClient(target) as agent:

            async def watch() -> None:
                nonlocal checks
                while time.monotonic() < deadline:
                    violations.extend(check_invariant(await agent.get_node()))
                    checks += 1
                    await asyncio.sleep(0.05)

            await asyncio.gather(
                watch(), *(caller(agent, deadline, acknowledged, refused) for _ in range(64))
            )
    finally:
        agent_process.send_signal(signal.SIGTERM)
        agent_process.wait(timeout=30)
    assert not violations
    assert checks > 10 and len(acknowledged) > 64
    stored = stored_leases(root)
    missing = [r for r, lease in acknowledged.items() if stored.get(r, ("",))[0] != lease]
    assert not missing, f"{len(missing)} acknowledged leases not in the store"
    print(
        json.dumps(
            {
                "soak_s": SOAK_S,
                "callers": 64,
                "acknowledged": len(acknowledged),
                "refused": len(refused),
                "invariant_checks": checks,
                "violations": len(violations),
            }
        )
    )


async def test_kill_9_mid_burst_loses_no_acknowledged_lease(root: Path) -> None:
    target = f"unix:{root / 'agent.sock'}"
    first = start(root)
    acknowledged: dict[str, str] = {}
    sent: list[str] = []
    await ready(target)

    async def burst(agent: AgentClient, index: int) -> None:
        for round_ in range(1000):
            request_id = f"k-{index}-{round_}"
            sent.append(request_id)
            answer = await agent.admit(
                request_id=request_id,
                tenant="t",
                trust_domain="crash",
                priority=Priority.BEST_EFFORT,
                memory_bytes=GIB // 4,
                thread_pct=1.0,
            )
            if answer.decision.admitted:
                acknowledged[request_id] = answer.lease.lease_id

    async with AgentClient(target, attempts=1) as agent:
        tasks = [asyncio.create_task(burst(agent, i)) for i in range(16)]
        await asyncio.sleep(1.0)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, Exception) for r in results), "the agent died mid-burst"
    assert len(acknowledged) > 20

    second = start(root)
    try:
        await ready(target)
        async with AgentClient(target) as agent:
            node = await agent.get_node()
            live = {lease.request_id: lease for lease in node.leases}
            for request_id, lease_id in acknowledged.items():
                assert live[request_id].lease_id == lease_id, f"{request_id} lost or changed"
            retried = await asyncio.gather(
                *(
                    agent.admit(
                        request_id=r,
                        tenant="t",
                        trust_domain="crash",
                        priority=Priority.BEST_EFFORT,
                        memory_bytes=GIB // 4,
                        thread_pct=1.0,
                    )
                    for r in list(acknowledged)[:50]
                )
            )
            assert [a.lease.lease_id for a in retried] == list(acknowledged.values())[:50]
            node = await agent.get_node()
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    ids = [lease.lease_id for lease in node.leases]
    assert len(ids) == len(set(ids)), "a lease is duplicated"
    by_device: dict[str, int] = {}
    for lease in node.leases:
        by_device[lease.device_uuid] = by_device.get(lease.device_uuid, 0) + lease.memory_bytes
    for entry in node.ledger:
        assert entry.memory_committed_bytes == by_device.get(entry.device_uuid, 0)
    stored = stored_leases(root)
    assert all(stored[r][0] == lease for r, lease in acknowledged.items())
    print(json.dumps({"acknowledged": len(acknowledged), "sent": len(sent)}))
