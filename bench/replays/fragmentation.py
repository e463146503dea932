"""Experiment 3: fragmentation, as in the scheduling article.

8 nodes x 8 GPUs; single-node jobs of 1, 2, 4, 8 GPUs with probabilities 0.35, 0.30, 0.20,
0.15; exponential run times with mean 120 min; Poisson arrivals for an offered load of 0.8
of the full cluster; 20,000 simulated minutes. First-, best- and worst-fit (the agent's
cluster placement), each with skip-ahead (any queued job that fits starts, in queue order)
and strict FIFO (nothing passes the head of the queue); then the same arrival streams with
one and two nodes lost.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from agent.admission.cluster import Cluster, Slot
from agent.admission.policy import Placement
from bench.replays.common import plot, write_table

NODES, GPUS = 8, 8
SIZES, WEIGHTS = (1, 2, 4, 8), (0.35, 0.30, 0.20, 0.15)
MEAN_RUN_MIN, LOAD, HORIZON_MIN = 120.0, 0.8, 20_000.0


def arrivals(seed: int) -> list[tuple[float, int, float]]:
    """(arrival minute, GPUs, run minutes), for the full 64-GPU cluster's offered load."""
    rng = np.random.default_rng(seed)
    mean_size = float(np.dot(SIZES, WEIGHTS))
    rate = LOAD * NODES * GPUS / (mean_size * MEAN_RUN_MIN)  # jobs per minute
    jobs, now = [], 0.0
    while True:
        now += rng.exponential(1 / rate)
        if now >= HORIZON_MIN:
            return jobs
        jobs.append((now, int(rng.choice(SIZES, p=WEIGHTS)), float(rng.exponential(MEAN_RUN_MIN))))


def simulate(
    jobs: list[tuple[float, int, float]], rule: Placement, *, skip_ahead: bool, nodes: int
) -> dict[str, float]:
    cluster = Cluster([GPUS] * nodes, rule)
    queue: list[int] = []  # job indices in arrival order
    running: list[tuple[float, int]] = []  # (end minute, job)
    slots: dict[int, Slot] = {}
    waits: dict[int, list[float]] = {s: [] for s in SIZES}
    busy_gpu_min = stranded_min = 0.0
    arrival_at, now = 0, 0.0

    def start_what_fits() -> None:
        for job in list(queue):
            slot = cluster.place(jobs[job][1])
            if slot is None:
                if not skip_ahead:
                    return
                continue
            queue.remove(job)
            slots[job] = slot
            waits[jobs[job][1]].append(now - jobs[job][0])
            heapq.heappush(running, (now + jobs[job][2], job))

    while True:
        next_arrival = jobs[arrival_at][0] if arrival_at < len(jobs) else float("inf")
        next_end = running[0][0] if running else float("inf")
        step_to = min(next_arrival, next_end, HORIZON_MIN)
        used = cluster.used_milli / 1000
        busy_gpu_min += used * (step_to - now)
        free = cluster.free_whole_gpus
        if any(jobs[j][1] == 8 for j in queue) and free >= 8 and cluster.largest_whole_block() < 8:
            stranded_min += step_to - now
        now = step_to
        if now >= HORIZON_MIN:
            break
        if next_end <= next_arrival:
            _end, job = heapq.heappop(running)
            cluster.release(slots.pop(job))
        else:
            queue.append(arrival_at)
            arrival_at += 1
        start_what_fits()
    result = {
        "utilisation": busy_gpu_min / (NODES * GPUS * HORIZON_MIN),
        "longest_8gpu_wait_min": max(
            waits[8] + [now - jobs[j][0] for j in queue if jobs[j][1] == 8], default=0.0
        ),
        "stranded_8gpu_wait_min": stranded_min,
        "queued_8gpu_at_end": float(sum(1 for j in queue if jobs[j][1] == 8)),
    }
    for size in SIZES:
        result[f"mean_wait_{size}gpu_min"] = (
            float(np.mean(waits[size])) if waits[size] else float("nan")
        )
    return result


def run(*, seeds: int) -> list[dict[str, Any]]:
    table = []
    for lost in (0, 1, 2):
        for rule in Placement:
            for skip_ahead in (True, False):
                runs = [
                    simulate(arrivals(seed), rule, skip_ahead=skip_ahead, nodes=NODES - lost)
                    for seed in range(seeds)
                ]
                row: dict[str, Any] = {
                    "nodes_lost": lost,
                    "rule": rule.value,
                    "queue": "skip-ahead" if skip_ahead else "strict-fifo",
                }
                for name in runs[0]:
                    row[name] = float(np.nanmean([r[name] for r in runs]))
                table.append(row)
    return table


def report(table: list[dict[str, Any]], seeds: int) -> None:
    write_table(
        "fragmentation",
        table,
        title="Experiment 3: fragmentation (8 nodes x 8 GPUs, offered load 0.8)",
        note=(
            f"Means over {seeds} arrival streams of 20,000 minutes. Utilisation is over the "
            "full 64 GPUs even when nodes are lost. stranded_8gpu_wait_min: minutes an 8-GPU "
            "job waited while 8 or more GPUs were free in total but on no single node."
        ),
    )
    series = {
        f"{rule.value} / {queue}": (
            [0, 1, 2],
            [
                r["mean_wait_8gpu_min"]
                for r in table
                if r["rule"] == rule.value and r["queue"] == queue
            ],
        )
        for rule in Placement
        for queue in ("skip-ahead", "strict-fifo")
    }
    plot(
        "fragmentation",
        series,
        title="Mean wait of 8-GPU jobs",
        xlabel="nodes lost",
        ylabel="minutes",
    )
