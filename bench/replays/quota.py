"""Experiment 5: team quotas, borrowing and reclaiming, as in the scheduling article.

8 nodes x 8 GPUs run by real node agents; teams A and B each have a nominal quota of 32
GPUs. Jobs are gangs of 1, 2 or 4 whole nodes (probabilities 0.5, 0.3, 0.2), exponential
run times with mean 120 minutes (an assumption: the article gives none), Poisson arrivals
sized so that in minutes 0-600 team A offers about 56 GPUs of demand and team B about 8,
and in minutes 600-1200 about 28 and 36. Policies:

- static: a team never runs more than its quota;
- borrow: a team may use idle GPUs beyond its quota; nobody is preempted;
- reclaim: borrow, and a job that keeps its team within quota is admitted ``guaranteed``
  while a borrowing job is ``best-effort``: the agent's own admission preempts borrowed
  leases (youngest first) for a guaranteed request; a preempted job loses its progress
  and re-queues.

Gangs go through ``Reserve`` / ``Commit`` on every node they need, or ``Abort``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.core.lease import Lease
from agent.core.types import PriorityClass
from bench.replays.agents import AgentCluster, Clock
from bench.replays.common import plot, write_table

NODES, GPUS, QUOTA, HORIZON, MEAN_RUN = 8, 8, 32, 1200, 120.0
NODE_COUNTS, NODE_WEIGHTS = (1, 2, 4), (0.5, 0.3, 0.2)
DEMAND = {"A": (56.0, 28.0), "B": (8.0, 36.0)}  # GPUs offered, first and second 600 min


@dataclass
class Job:
    name: str
    team: str
    arrival: float
    nodes: int
    run_min: float
    leases: list[Lease] = field(default_factory=list)
    started: float | None = None
    done: bool = False
    waited: float | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS


def stream(seed: int) -> list[Job]:
    rng = np.random.default_rng(seed)
    mean_gpus = GPUS * float(np.dot(NODE_COUNTS, NODE_WEIGHTS))
    jobs = []
    for team, phases in DEMAND.items():
        for phase, demand in enumerate(phases):
            rate = demand / (mean_gpus * MEAN_RUN)
            now = 600.0 * phase
            while True:
                now += rng.exponential(1 / rate)
                if now >= 600.0 * (phase + 1):
                    break
                nodes = int(rng.choice(NODE_COUNTS, p=NODE_WEIGHTS))
                jobs.append(Job(f"{team}{len(jobs)}", team, now, nodes, rng.exponential(MEAN_RUN)))
    return sorted(jobs, key=lambda j: j.arrival)


class Run:
    def __init__(self, policy: str, jobs: list[Job]) -> None:
        self.policy, self.jobs = policy, jobs
        self.clock = Clock()
        self.cluster = AgentCluster(NODES, GPUS, self.clock)
        self.busy_gpu_min = 0.0
        self.preemptions = 0
        self.lost_gpu_h = 0.0
        self.timeline: list[float] = []

    def running(self, team: str | None = None) -> list[Job]:
        return [j for j in self.jobs if j.started is not None and (team is None or j.team == team)]

    async def go(self) -> dict[str, Any]:
        await self.cluster.start()
        try:
            for minute in range(HORIZON):
                self.clock.minute = float(minute)
                await self._finish(minute)
                await self._start(minute)
                await self._notice_preempted(minute)
                busy = sum(j.gpus for j in self.running())
                self.busy_gpu_min += busy
                self.timeline.append(busy)
        finally:
            await self.cluster.aclose()
        return self._result()

    async def _finish(self, minute: int) -> None:
        for job in self.running():
            assert job.started is not None
            if minute - job.started >= job.run_min:
                await self.cluster.release(job.leases)
                job.leases, job.started, job.done = [], None, True

    async def _start(self, minute: int) -> None:
        for job in [
            j for j in self.jobs if j.arrival <= minute and j.started is None and not j.done
        ]:
            used = sum(j.gpus for j in self.running(job.team))
            within = used + job.gpus <= QUOTA
            if self.policy == "static" and not within:
                continue
            guaranteed = self.policy == "reclaim" and within
            nodes = self._nodes_for(job, may_preempt=guaranteed)
            if nodes is None:
                continue
            priority = (
                PriorityClass.GUARANTEED
                if guaranteed
                else (
                    PriorityClass.BEST_EFFORT
                    if self.policy == "reclaim"
                    else PriorityClass.BURSTABLE
                )
            )
            if await self._gang(job, nodes, priority):
                job.started = float(minute)
                if job.waited is None:
                    job.waited = minute - job.arrival

    def _nodes_for(self, job: Job, *, may_preempt: bool) -> list[int] | None:
        free = [n for n in range(NODES) if self.cluster.free_gpus(n) == GPUS]
        if len(free) >= job.nodes:
            return free[: job.nodes]
        if not may_preempt:
            return None
        borrowed = {  # nodes held whole by the other team's borrowed jobs, youngest first
            self.cluster.node_of(lease): j.started
            for j in self.running()
            if j.team != job.team
            for lease in j.leases
            if lease.priority is PriorityClass.BEST_EFFORT
        }
        others = sorted(borrowed, key=lambda n: -(borrowed[n] or 0))
        chosen = free + [n for n in others if n not in free]
        return chosen[: job.nodes] if len(chosen) >= job.nodes else None

    async def _gang(self, job: Job, nodes: list[int], priority: PriorityClass) -> bool:
        touched = []
        for node in nodes:
            results = await self.cluster.take(
                node, GPUS, tenant=job.team, priority=priority, gang=job.name
            )
            if any(r.decision.admitted for r in results):
                touched.append(node)
            if not all(r.decision.admitted for r in results):
                for held in touched:  # Abort where something was reserved
                    await self.cluster.nodes[held].abort(job.name)
                return False
        for node in nodes:
            job.leases += await self.cluster.nodes[node].commit(job.name)
        return True

    async def _notice_preempted(self, minute: int) -> None:
        live = {i for node in self.cluster.nodes for i in node.leases}
        for job in self.running():
            if all(x.lease_id in live for x in job.leases):
                continue
            assert job.started is not None
            self.preemptions += 1
            self.lost_gpu_h += job.gpus * (minute - job.started) / 60.0
            await self.cluster.release(job.leases)
            job.leases, job.started = [], None  # re-queues, progress lost

    def _result(self) -> dict[str, Any]:
        def waits(team: str, after: float = -1.0) -> float:
            values = [
                j.waited if j.waited is not None else HORIZON - j.arrival
                for j in self.jobs
                if j.team == team and j.arrival >= after
            ]
            return float(np.mean(values)) if values else float("nan")

        return {
            "utilisation": self.busy_gpu_min / (NODES * GPUS * HORIZON),
            "mean_wait_A_min": waits("A"),
            "mean_wait_B_min": waits("B"),
            "B_wait_after_600_min": waits("B", 600.0),
            "preemptions": float(self.preemptions),
            "gpu_hours_lost": self.lost_gpu_h,
        }


def run(*, streams: int) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    table, timelines = [], {}
    for policy in ("static", "borrow", "reclaim"):
        runs = []
        for seed in range(streams):
            one = Run(policy, stream(seed))
            runs.append(asyncio.run(one.go()))
            if seed == 0:
                timelines[policy] = one.timeline
        row: dict[str, Any] = {"policy": policy}
        for name in runs[0]:
            row[name] = float(np.nanmean([r[name] for r in runs]))
        table.append(row)
    return table, timelines


def report(table: list[dict[str, Any]], timelines: dict[str, list[float]], streams: int) -> None:
    write_table(
        "quota",
        table,
        title="Experiment 5: quotas, borrowing and reclaiming (8 nodes x 8 GPUs)",
        note=(
            f"Means over {streams} random streams, minutes 0-1200; a job still waiting at "
            "1200 counts its wait so far. Run times are exponential with mean 120 min (an "
            "assumption). Gangs via Reserve/Commit, preemption by the agent's own policy."
        ),
    )
    plot(
        "quota",
        {p: (list(range(len(t))), t) for p, t in timelines.items()},
        title="GPUs busy (stream 0)",
        xlabel="minute",
        ylabel="GPUs running jobs",
    )
