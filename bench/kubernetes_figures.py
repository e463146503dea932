"""What bench/kubernetes.py reports: the scheduler stand-in timing each bind, the CPU by part
of the benchmark, and the summary of a run (its figures, the faults, the targets)."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from bench.kubernetes_plan import NAMESPACE, PodPlan
from tests.kubeworld.scheduler.extender import SchedulerStandIn

if TYPE_CHECKING:
    from bench.kubernetes import Run


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0


class TimedScheduler(SchedulerStandIn):
    """The scheduler stand-in, timing each call to the extender's ``/bind``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bind_ms: list[float] = []
        self.refused_ms: list[float] = []
        self.refusals: Counter[str] = Counter()
        self.on_bound: Any = None

    async def _post(self, url: str, body: Any) -> Any:
        if not url.endswith("/bind"):
            return await super()._post(url, body)
        started = time.perf_counter()
        result = await super()._post(url, body)
        took_ms = 1e3 * (time.perf_counter() - started)
        if result.get("Error"):
            self.refused_ms.append(took_ms)
            self.refusals[_gist(result["Error"])] += 1
        else:
            self.bind_ms.append(took_ms)
            if self.on_bound is not None:
                self.on_bound(body["PodUID"])
        return result


def _gist(error: str) -> str:
    """A refusal without its node and pod names, to count alike ones together."""
    words = [w for w in error.split() if not any(c.isdigit() for c in w)]
    return " ".join(words)[:80]


def part_of(command: list[str]) -> str:
    """The benchmark's part a child process is, by its command line."""
    if "kube" in command and "serve" in command:
        return "cluster_side"
    if "serve" in command:
        return "agents"
    if any(word.endswith("kube_scheduler_proc.py") for word in command):
        return "scheduler"
    return "other"


def summarize(
    bench: Run,
    units: list[list[PodPlan]],
    leases: list[tuple[str, str, str]],
    left: list[str],
    done_at: float,
    load_before: tuple[float, float, float],
) -> dict[str, Any]:
    plans = [plan for unit in units for plan in unit]
    leased_pods = {pod for _, pod, _ in leases if pod}
    for plan in plans:
        if f"{NAMESPACE}/{plan.name}" in leased_pods:
            plan.outcome = plan.outcome or "lease never released"
        if plan.name in left:
            plan.outcome = plan.outcome or "stuck with the finalizer"
    lost = [p for p in plans if p.outcome]
    never_started = [
        p for p in plans if p.bound.is_set() and p.outcome.startswith("not run") and not p.rejected
    ]
    gangs = [unit for unit in units if unit[0].gang]
    partial = [u for u in gangs if 0 < sum(p.bound.is_set() for p in u) < len(u)]
    bound = sum(p.bound.is_set() for p in plans)
    span = max(bench.last_bind - bench.first_create, 1e-9)
    cpu_s_all = bench.cpu_ms_per_pod.get("all", 0.0) * len(plans) / 1e3
    scheduler = bench.scheduler
    result: dict[str, Any] = {
        "nodes": bench.args.nodes,
        "injector": bench.args.injector,
        "cpus": os.cpu_count(),
        "load_avg_1m_before": round(load_before[0], 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "pods": len(plans),
        "bound": bound,
        "pods_per_s": round(bound / span, 1),
        "all_done_s": round(done_at - bench.first_create, 1),
        "bind_p50_ms": pct(scheduler.bind_ms, 0.5),
        "bind_p99_ms": pct(scheduler.bind_ms, 0.99),
        "admit_p50_ms": pct(bench.admit_ms, 0.5),
        "admit_p99_ms": pct(bench.admit_ms, 0.99),
        "admit_samples": len(bench.admit_ms),
        "bind_refused": len(scheduler.refused_ms),
        "bind_refusals": dict(scheduler.refusals.most_common(5)),
        "gangs": len(gangs),
        "gangs_partial": len(partial),
        "endings": dict(Counter(p.ending for p in plans if not p.outcome and not p.evicted)),
        "evicted": sum(p.evicted for p in plans),
        "ledger_samples": bench.samples,
        "leases_leaked": len(leases),
        "leaked": [" ".join(x) for x in leases[:3]],
        "wrong_lease_injections": len(bench.wrong),
        "mismatches_refused": len(bench.refused),
        "refused_why": [x[:200] for x in bench.refused[:3]],
        "overcommit": len(bench.overcommit),
        "running_without_lease": len(bench.without_lease),
        "pods_never_started": len(never_started),
        "rejected_agent_away": sum(p.rejected for p in plans),
        "lost": len(lost),
        "lost_why": dict(Counter(p.outcome for p in lost)),
        "stuck_why": [x[:300] for x in bench.stuck[:3]],
        # from the first create to the last pod gone; inline parts count as the harness
        "cpu_ms_per_pod": bench.cpu_ms_per_pod,
        "cores_busy": round(cpu_s_all / (done_at - bench.first_create), 2),
    }
    if bench.chaos is not None:
        result["faults"] = bench.chaos.report()
    result["targets"] = {
        "correct": all(
            result[k] == 0
            for k in (
                "leases_leaked",
                "wrong_lease_injections",
                "overcommit",
                "running_without_lease",
                "pods_never_started",
                "lost",
            )
        ),
        "bind_within_3x_admit": result["bind_p50_ms"] <= 3 * result["admit_p50_ms"],
        "pods_per_s_at_least_50": result["pods_per_s"] >= 50,
    }
    running = sorted(bench.without_lease)
    for line in (bench.wrong + bench.refused + bench.overcommit + running)[:10]:
        print(f"finding: {line}", file=sys.stderr)
    return result
