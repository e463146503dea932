"""Experiment 4: gang admission, as in the scheduling article.

4 nodes x 4 GPUs run by real node agents (``bench/replays/agents.py``). Three jobs, each 4
workers x 2 GPUs, are created interleaved (worker 1 of each job, then worker 2, ...); a job
computes for 60 minutes once all its workers run; 300 simulated minutes, one step a minute.

- pod by pod: each worker is admitted on its own as soon as a node has room and holds its
  GPUs while it waits for its peers;
- gang: each minute the first waiting job reserves all its workers (``Reserve`` on each
  node, with the gang id); if every reservation holds it commits them (``Commit``), else it
  aborts them all (``Abort``) and nothing is held.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent.core.lease import Lease
from agent.core.types import PriorityClass
from bench.replays.agents import AgentCluster, Clock
from bench.replays.common import plot, write_table

NODES, GPUS, JOBS, WORKERS, PER_WORKER, RUN_MIN, HORIZON = 4, 4, 3, 4, 2, 60, 300


async def simulate(mode: str) -> dict[str, Any]:
    clock = Clock()
    cluster = AgentCluster(NODES, GPUS, clock)
    await cluster.start()
    held: dict[str, list[Lease]] = {f"job{j}": [] for j in range(JOBS)}
    placed_workers = {job: 0 for job in held}
    started: dict[str, float] = {}
    done: set[str] = set()
    creation = [(f"job{j}", w) for w in range(WORKERS) for j in range(JOBS)]  # interleaved
    held_gpu_min = useful_gpu_min = 0.0
    timeline = []
    try:
        for minute in range(HORIZON):
            clock.minute = float(minute)
            for job, at in list(started.items()):
                if minute - at >= RUN_MIN:
                    await cluster.release(held[job])
                    held[job] = []
                    done.add(job)
                    del started[job]
            if mode == "pod-by-pod":
                await _pods(cluster, creation, held, placed_workers)
            else:
                await _gangs(cluster, held, placed_workers, started, done)
            for job, workers in placed_workers.items():
                if workers == WORKERS and job not in started and job not in done:
                    started[job] = float(minute)
            holding = sum(len(v) for v in held.values())
            running = sum(len(held[j]) for j in started)
            held_gpu_min += holding
            useful_gpu_min += running
            timeline.append(running)
    finally:
        await cluster.aclose()
    return {
        "mode": mode,
        "jobs_finished": len(done),
        "gpu_min_held": held_gpu_min,
        "gpu_min_useful": useful_gpu_min,
        "useful_share": useful_gpu_min / held_gpu_min if held_gpu_min else 0.0,
        "timeline": timeline,
    }


async def _pods(
    cluster: AgentCluster,
    creation: list[tuple[str, int]],
    held: dict[str, list[Lease]],
    placed: dict[str, int],
) -> None:
    while creation:
        job, _worker = creation[0]
        node = next((n for n in range(NODES) if cluster.free_gpus(n) >= PER_WORKER), None)
        if node is None:
            return
        results = await cluster.take(
            node, PER_WORKER, tenant=job, priority=PriorityClass.BURSTABLE, gang=None
        )
        held[job] += [r.lease for r in results if r.lease is not None]
        placed[job] += 1
        creation.pop(0)


async def _gangs(
    cluster: AgentCluster,
    held: dict[str, list[Lease]],
    placed: dict[str, int],
    started: dict[str, float],
    done: set[str],
) -> None:
    for job in held:
        if job in started or job in done or placed[job] == WORKERS:
            continue
        touched: set[int] = set()
        ok = True
        for _worker in range(WORKERS):
            node = next((n for n in range(NODES) if cluster.free_gpus(n) >= PER_WORKER), None)
            if node is None:
                ok = False
                break
            touched.add(node)
            results = await cluster.take(
                node, PER_WORKER, tenant=job, priority=PriorityClass.BURSTABLE, gang=job
            )
            ok = ok and all(r.decision.admitted for r in results)
        if not ok:
            for node in touched:
                await cluster.nodes[node].abort(job)
            return  # FIFO among gangs: nobody passes the first waiting job
        for node in touched:
            held[job] += await cluster.nodes[node].commit(job)
        placed[job] = WORKERS


def run() -> list[dict[str, Any]]:
    return [asyncio.run(simulate(mode)) for mode in ("pod-by-pod", "gang")]


def report(results: list[dict[str, Any]]) -> None:
    write_table(
        "gang",
        [{k: v for k, v in r.items() if k != "timeline"} for r in results],
        title="Experiment 4: pod-by-pod against gang admission (4 nodes x 4 GPUs)",
        note=(
            "Three jobs of 4 workers x 2 GPUs, created interleaved, 60 minutes of work each, "
            "300 minutes. GPU-minutes held: GPUs under a lease; useful: GPUs of jobs whose "
            "workers all run. Placed by real node agents (Reserve / Commit / Abort)."
        ),
    )
    plot(
        "gang",
        {r["mode"]: (list(range(len(r["timeline"]))), r["timeline"]) for r in results},
        title="GPUs doing useful work",
        xlabel="minute",
        ylabel="GPUs of running jobs",
    )
