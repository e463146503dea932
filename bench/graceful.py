"""SIGTERM restarts of the real agent under load, with runtime.on_stop keep (the default):
a job connected to each device's MPS server must keep its control daemon and its connection
across every restart, and no acknowledged lease may be lost (part of bench/reliability.py)."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Agent, Ledger, audit, callers

from agent.client import AgentClient

FAKE_BINARY = str(Path(sys.executable).parent / "gpushare-fake-mps-control")


async def daemons_and_clients(
    agent: Agent, expected: int = 0, within_s: float = 10.0
) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Device -> (control daemon PID, its clients), once every daemon is up and the agent
    lists ``expected`` clients in all (or ``within_s`` passed: a probe lists them)."""
    deadline = asyncio.get_running_loop().time() + within_s
    async with AgentClient(agent.unix, attempts=1) as client:
        while True:
            node = await client.get_node()
            found = {
                d.device_uuid: (d.pid, tuple(c for s in d.servers for c in s.client_pids))
                for d in node.mps
            }
            up = node.mps and all(d.up for d in node.mps)
            clients = sum(len(c) for _pid, c in found.values())
            if (up and clients >= expected) or asyncio.get_running_loop().time() > deadline:
                return found
            await asyncio.sleep(0.1)


async def restarts_graceful(root: Path, size: dict[str, int]) -> dict[str, Any]:
    """SIGTERM restarts under load with runtime.on_stop keep (the default): a job (a client
    of each device's MPS server; the fake control binary connects it without a GPU) must
    keep its daemon and its connection across every restart."""
    extra = ("--set", "runtime.on_stop=keep", "--set", f"mps.control_binary={FAKE_BINARY}")
    agent, ledger = Agent(root, extra), Ledger()
    agent.start()
    await agent.ready()
    jobs = [subprocess.Popen(["sleep", "3600"]) for _ in range(4)]  # noqa: ASYNC220
    replaced = cut_off = 0
    try:
        before = await daemons_and_clients(agent)
        for (device, (_pid, _clients)), job in zip(sorted(before.items()), jobs, strict=False):
            pipe = f"{root}/mps/{device}/pipe"
            while await sh_input(FAKE_BINARY, f"fake_connect_client {job.pid} 0\n", pipe):  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # the daemon is between probes: again
        before = await daemons_and_clients(agent, expected=len(jobs))
        for _ in range(size["restarts"]):
            burst = asyncio.create_task(
                callers(f"127.0.0.1:{agent.tcp_port}", size["callers"], 1.5, ledger)
            )
            await asyncio.sleep(random.uniform(0.5, 1.0))
            agent.stop()
            await burst
            agent.start()
            await agent.ready()
            after = await daemons_and_clients(agent, expected=len(jobs))
            replaced += sum(after.get(d, (0, ()))[0] != pid for d, (pid, _c) in before.items())
            cut_off += sum(
                len(set(clients) - set(after.get(d, (0, ()))[1]))
                for d, (_pid, clients) in before.items()
            )
        agent.stop()
    finally:
        for job in jobs:
            job.kill()
            job.wait()
        closer = Agent(root, ("--set", "runtime.on_stop=quit",
                              "--set", f"mps.control_binary={FAKE_BINARY}"))  # fmt: skip
        closer.start()
        await closer.ready()
        closer.stop()
    return {
        "sigterm_restarts": size["restarts"],
        "jobs": sum(len(c) for _p, c in before.values()),
        "mps_daemons_replaced": replaced,
        "clients_cut_off": cut_off,
        "acknowledged": len(ledger.admitted),
        **audit(agent, ledger),
    }


async def sh_input(binary: str, text: str, pipe_dir: str) -> int:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
    process = await asyncio.create_subprocess_exec(
        binary, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env
    )
    await process.communicate(text.encode())
    return process.returncode or 0
