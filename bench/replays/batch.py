"""Experiment 1: readiness-aware batch admission, as in the readiness paper.

A batch of SYNTHETIC jobs (``agent.sim.readiness_synth``: 47.3% become ready) whose
requested GPUs add up to ``load`` x the cluster's GPUs is ordered by a policy and placed
with the agent's cluster placement (``agent.admission.cluster``). Policies: arrival (FCFS),
shortest declared duration, smallest and largest request first, random, the two lookup
rules and the predictor (both fitted on a separate synthetic training set), and the true
label (an upper bound no scheduler has). Every policy sees the same batch (paired by seed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.admission.cluster import Cluster, order_and_place
from agent.admission.policy import Placement
from agent.estimator.readiness import LookupRule
from agent.estimator.readiness_data import Dataset
from agent.estimator.readiness_training import train
from agent.sim.readiness_synth import SyntheticJobs, generate
from bench.replays.common import jain, openb_gpu_nodes, plot, synthetic_nodes, write_table

LOADS = (1.0, 1.25, 1.5, 2.0, 2.5)
POLICIES = (
    "fcfs",
    "shortest-duration",
    "smallest-first",
    "largest-first",
    "random",
    "lookup-model-x-job",
    "lookup-job-x-duration",
    "predictor",
    "true-label",
)
RANDOM_ORDERS = 5
SIZE_BINS = ((0.0, 1.0), (1.0, 2.0), (2.0, 4.0), (4.0, 8.0), (8.0, 1e9))


def batch_for(jobs: SyntheticJobs, capacity_gpus: int, load: float) -> list[int]:
    """The first jobs whose requests add up to ``load`` x capacity."""
    wanted, total, chosen = load * capacity_gpus, 0.0, []
    for at, row in enumerate(jobs.rows):
        if total >= wanted:
            break
        chosen.append(at)
        total += float(row["requested_gpus"])
    if total < wanted:
        raise SystemExit("not enough synthetic jobs for this load: raise --jobs")
    return chosen


class Scorers:
    """Each policy's score for a job (higher is placed first); arrival breaks ties."""

    def __init__(self, training: SyntheticJobs, seed: int, trees: int) -> None:
        data = Dataset(training.rows, training.labels, training.groups)
        self.model = train(data, trees=trees, seed=seed, provenance="replay training set")
        self.lookups = {
            rule: LookupRule.fit(rule, training.rows, training.labels)
            for rule in ("model-x-job", "job-x-duration")
        }
        self.seed = seed

    def scores(
        self, policy: str, rows: Sequence[Any], labels: Sequence[bool], *, attempt: int = 0
    ) -> list[float] | None:
        gpus = np.asarray([float(r["requested_gpus"]) for r in rows])
        table: dict[str, Callable[[], Any]] = {
            "fcfs": lambda: None,
            "shortest-duration": lambda: [-float(r["declared_duration_s"]) for r in rows],
            "smallest-first": (-gpus).tolist,
            "largest-first": gpus.tolist,
            "random": lambda: (
                np.random.default_rng([self.seed, attempt]).random(len(rows)).tolist()
            ),
            "lookup-model-x-job": lambda: self.lookups["model-x-job"].predict(rows).tolist(),
            "lookup-job-x-duration": lambda: self.lookups["job-x-duration"].predict(rows).tolist(),
            "predictor": lambda: self.model.predict(rows).tolist(),
            "true-label": lambda: [1.0 if y else 0.0 for y in labels],
        }
        result: list[float] | None = table[policy]()
        return result


def metrics(
    rows: Sequence[Any], labels: Sequence[bool], placed: Sequence[bool], cluster: Cluster, gpus: int
) -> dict[str, float]:
    size = np.asarray([float(r["requested_gpus"]) for r in rows])
    ready = np.asarray(labels, dtype=bool)
    on = np.asarray(placed, dtype=bool)
    held = np.where(size < 1, size, np.ceil(size - 1e-9))
    large = size >= 8
    coverage = []
    for low, high in SIZE_BINS:
        in_bin = (size >= low) & (size < high) & ready
        coverage.append(float((in_bin & on).sum() / in_bin.sum()) if in_bin.any() else float("nan"))
    return {
        "W": float(held[on & ~ready].sum() / gpus),
        "effective_job_ratio": float((on & ready).sum() / len(rows)),
        "effective_share_placed": float((on & ready).sum() / max(on.sum(), 1)),
        "large_effective_coverage": float(
            (on & ready & large).sum() / max((ready & large).sum(), 1)
        ),
        "effective_jobs_per_gpu": float((on & ready).sum() / gpus),
        "allocation_rate": cluster.used_milli / cluster.total_milli,
        "jain_readiness": jain(coverage),
    }


def run(
    *, openb: Path | None, seeds: int, trees: int, jobs: int, rules: Sequence[Placement]
) -> list[dict[str, Any]]:
    supplies: dict[str, list[int]] = {"synthetic-512": synthetic_nodes(512, seed=5)}
    if openb is not None:
        supplies["openb"] = [gpus for _name, gpus, _model in openb_gpu_nodes(openb)]
    results: list[dict[str, Any]] = []
    for seed in range(seeds):
        scorers = Scorers(generate(20_000, seed=1000 + seed), seed, trees)
        for supply, nodes in supplies.items():
            capacity = sum(nodes)
            pool = generate(max(jobs, int(capacity * 3)), seed=seed)
            for load in LOADS:
                chosen = batch_for(pool, capacity, load)
                rows = [pool.rows[i] for i in chosen]
                labels = [pool.labels[i] for i in chosen]
                sizes = [float(r["requested_gpus"]) for r in rows]
                for policy in POLICIES:
                    # random: the mean of RANDOM_ORDERS orders, so one lucky shuffle is not
                    # mistaken for a policy
                    tries = RANDOM_ORDERS if policy == "random" else 1
                    for rule in rules:
                        runs = []
                        for attempt in range(tries):
                            scores = scorers.scores(policy, rows, labels, attempt=attempt)
                            cluster = Cluster(nodes, rule)
                            slots = order_and_place(cluster, sizes, scores)
                            placed = [s is not None for s in slots]
                            runs.append(metrics(rows, labels, placed, cluster, capacity))
                        mean = {k: float(np.nanmean([r[k] for r in runs])) for k in runs[0]}
                        results.append(
                            {
                                "supply": supply,
                                "rule": rule.value,
                                "load": load,
                                "seed": seed,
                                "policy": policy,
                                **mean,
                            }
                        )
    return results


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Means over seeds; paired W difference against FCFS and the predictor's gap captured."""
    keys = sorted({(r["supply"], r["rule"], r["load"]) for r in results})
    table = []
    for supply, rule, load in keys:
        same = [r for r in results if (r["supply"], r["rule"], r["load"]) == (supply, rule, load)]
        by_policy = {p: [r for r in same if r["policy"] == p] for p in POLICIES}
        fcfs_w = np.asarray([r["W"] for r in by_policy["fcfs"]])
        best_w = np.asarray([r["W"] for r in by_policy["true-label"]])
        for policy, runs in by_policy.items():
            w = np.asarray([r["W"] for r in runs])
            gap = fcfs_w - best_w
            row = {"supply": supply, "rule": rule, "load": load, "policy": policy}
            for name in runs[0]:
                if name not in ("supply", "rule", "load", "seed", "policy"):
                    row[name] = float(np.nanmean([r[name] for r in runs]))
            row["dW_vs_fcfs"] = float((w - fcfs_w).mean())
            row["dW_ci95"] = _half_width(w - fcfs_w)
            row["seeds_better_than_fcfs"] = int((w < fcfs_w - 1e-12).sum())
            row["gap_captured"] = float(((fcfs_w - w) / np.where(gap > 0, gap, np.nan)).mean())
            table.append(row)
    return table


def report(table: list[dict[str, Any]], seeds: int) -> None:
    write_table(
        "batch",
        table,
        title="Experiment 1: readiness-aware batch admission (SYNTHETIC demand)",
        note=(
            f"Means over {seeds} seeds. W: share of the cluster's GPUs held by placed jobs that "
            "never become ready. dW_vs_fcfs: paired difference in W; gap_captured: "
            "(W_fcfs - W) / (W_fcfs - W_true-label). Demand is synthetic (47.3% ready, the "
            "ASI share); see docs/replay.md."
        ),
    )
    best = [r for r in table if r["rule"] == "best-fit"]
    supply = "openb" if any(r["supply"] == "openb" for r in best) else best[0]["supply"]
    series = {
        p: (
            [r["load"] for r in best if r["policy"] == p and r["supply"] == supply],
            [r["W"] for r in best if r["policy"] == p and r["supply"] == supply],
        )
        for p in POLICIES
    }
    plot(
        "batch",
        series,
        title=f"W by ordering policy ({supply}, best-fit, synthetic demand)",
        xlabel="load (requested GPUs / cluster GPUs)",
        ylabel="ineffective occupancy W",
    )


def _half_width(differences: np.ndarray) -> float:  # type: ignore[type-arg]
    """Half the width of a 95% t-interval of the mean paired difference."""
    from scipy.stats import t

    n = len(differences)
    if n < 2:
        return float("nan")
    return float(t.ppf(0.975, n - 1) * differences.std(ddof=1) / np.sqrt(n))
