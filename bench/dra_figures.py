"""What bench/dra.py reports: the phases beside the churn (idle, no-op calls, quiet
Prepare+Unprepare pairs) and the summary of a run (claims, CPU, slice writes, targets)."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.client import AgentClient
from bench.cpu import cpu_by_part
from bench.dra_checks import claim_name_of
from bench.dra_plan import EXTENDED, NAMESPACE, PodPlan, say
from tests.kubeworld.apiserver import FakeApiServer, Obj
from tests.kubeworld.cluster.dra import claim_pod

if TYPE_CHECKING:
    from bench.dra import Bench

# -- the phases beside the churn ---------------------------------------------------------------


@dataclass
class Measured:
    """What the phases measured, for the summary."""

    churn_cpu: dict[str, float] = field(default_factory=dict)  # ms per pod, by part
    churn_agents_s: float = 0.0
    churn_end: float = 0.0
    leases: list[tuple[str, str, str]] = field(default_factory=list)
    left_claims: list[Obj] = field(default_factory=list)
    idle_ms_per_s: float = 0.0
    noop: Obj = field(default_factory=dict)
    quiet: Obj = field(default_factory=dict)
    slices: Obj = field(default_factory=dict)


def part_of(command: list[str]) -> str:
    return "agents" if "serve" in command else "other"


def agents_cpu_s() -> float:
    return float(cpu_by_part(part_of)["agents"])


# -- putting it together -----------------------------------------------------------------------


def _lost(plans: list[PodPlan], measured: Measured) -> list[PodPlan]:
    leased = {pod for _, pod, _ in measured.leases}
    owners = {
        o.get("uid")
        for c in measured.left_claims
        for o in c["metadata"].get("ownerReferences") or []
    }
    for plan in plans:
        if f"{NAMESPACE}/{plan.name}" in leased:
            plan.outcome = plan.outcome or "lease never released"
        if plan.uid in owners:
            plan.outcome = plan.outcome or "claim left in the API"
    return [p for p in plans if p.outcome]


async def idle_ms_per_s(seconds: float) -> float:
    """All agents' CPU while nothing is asked of them, ms per second."""
    before, started = agents_cpu_s(), time.monotonic()
    await asyncio.sleep(seconds)
    return round(1e3 * (agents_cpu_s() - before) / (time.monotonic() - started), 2)


async def noop_phase(clients: dict[str, AgentClient], calls: int, callers: int) -> Obj:
    """``calls`` Pings per agent from ``callers`` callers each, all agents at once."""

    async def caller(client: AgentClient, count: int) -> None:
        for _ in range(count):
            await client.ping()

    per_caller = max(1, calls // callers)
    before, started = agents_cpu_s(), time.monotonic()
    await asyncio.gather(*(caller(c, per_caller) for c in clients.values() for _ in range(callers)))
    spent_s, wall_s = agents_cpu_s() - before, time.monotonic() - started
    total = per_caller * callers * len(clients)
    return {"calls": total, "cpu_s": spent_s, "wall_s": wall_s}


async def quiet_phase(bench: Bench, pods: int, cycles: int) -> Obj:
    """Claims allocated and prepared (pods Running), then each Unprepared and Prepared
    again ``cycles`` times straight on its node's plugin, one claim at a time, nothing else
    going on; the pods deleted after."""
    cluster, server = bench.cluster, bench.server
    names = [f"quiet-{i}" for i in range(pods)]
    for name in names:
        server.put_object("pods", claim_pod(name, "m8g-t25", NAMESPACE))
    if not await bench.until(lambda: all(_phase(server, n) == "Running" for n in names)):
        stuck = [n for n in names if _phase(server, n) != "Running"]
        raise RuntimeError(f"quiet phase: never Running: {stuck[:5]}")
    claims = [_claim_and_node(server, n) for n in names]
    failures = 0
    before, started = agents_cpu_s(), time.monotonic()
    for _ in range(cycles):
        for claim, node in claims:
            kubelet = cluster.nodes[node].kubelet
            undone = await kubelet.unprepare([claim])
            done = await kubelet.prepare([claim])
            failures += sum(bool(e) for e in undone.values())
            failures += sum(isinstance(r, str) for r in done.values())
    spent_s, wall_s = agents_cpu_s() - before, time.monotonic() - started
    for name in names:
        server.delete_pod(NAMESPACE, name, force=True)
    await bench.until(lambda: not any((NAMESPACE, n) in server.objects["pods"] for n in names))
    return {"pairs": len(claims) * cycles, "cpu_s": spent_s, "wall_s": wall_s, "failed": failures}


def _phase(server: FakeApiServer, name: str) -> str:
    pod = server.objects["pods"].get((NAMESPACE, name)) or {}
    return str((pod.get("status") or {}).get("phase") or "")


def _claim_and_node(server: FakeApiServer, name: str) -> tuple[Obj, str]:
    pod = server.objects["pods"][(NAMESPACE, name)]
    claim = server.objects["resourceclaims"][(NAMESPACE, claim_name_of(pod))]
    return claim, str(pod["spec"]["nodeName"])


def claim_counts(bench: Bench) -> Obj:
    """Claims of the churn's pods prepared (their containers created: every claim of the
    pod was answered with devices) and unprepared, from the pod worker's records."""
    runner = bench.runner
    answers = [a for p in bench.plans for a in runner.stopped.get(p.uid, {}).values()]
    return {
        "prepared": sum(p.key in runner.containers for p in bench.plans),
        "unprepared": sum(not a for a in answers),
        "unprepare_errors": sum(bool(a) for a in answers),
    }


def cpu_figures(pairs: int, measured: Measured, span_s: float) -> Obj:
    noop, quiet = measured.noop, measured.quiet
    churn_ms = 1e3 * measured.churn_agents_s / max(pairs, 1)
    noop_ms = 1e3 * noop["cpu_s"] / max(noop["calls"], 1)
    quiet_ms = 1e3 * quiet["cpu_s"] / max(quiet["pairs"], 1)
    idle_s_per_s = measured.idle_ms_per_s / 1e3
    churn_busy_ms = 1e3 * (measured.churn_agents_s - idle_s_per_s * span_s) / max(pairs, 1)
    noop_busy_ms = 1e3 * (noop["cpu_s"] - idle_s_per_s * noop["wall_s"]) / max(noop["calls"], 1)
    return {
        "agent_cpu_ms_per_prepare_unprepare": round(churn_ms, 3),
        "agent_cpu_ms_per_noop": round(noop_ms, 3),
        "cpu_ratio": round(churn_ms / max(noop_ms, 1e-9), 2),
        "agent_cpu_ms_per_prepare_unprepare_quiet": round(quiet_ms, 3),
        "cpu_ratio_quiet": round(quiet_ms / max(noop_ms, 1e-9), 2),
        "agent_cpu_idle_ms_per_s": measured.idle_ms_per_s,
        "cpu_ratio_idle_subtracted": round(churn_busy_ms / max(noop_busy_ms, 1e-9), 2),
        "noop_calls": noop["calls"],
        "noop_per_s": round(noop["calls"] / max(noop["wall_s"], 1e-9), 1),
        "quiet_pairs": quiet["pairs"],
        "quiet_failed": quiet["failed"],
    }


def summarize(bench: Bench, measured: Measured, load_before: tuple[float, float, float]) -> Obj:
    plans = bench.plans
    lost = _lost(plans, measured)
    scheduler = bench.cluster.scheduler
    assert scheduler is not None
    counts = claim_counts(bench)
    running = sum(p.running_at > 0 for p in plans)
    span_s = measured.churn_end - bench.first_create
    result: Obj = {
        "nodes": bench.args.nodes,
        "cpus": os.cpu_count(),
        "load_avg_1m_before": round(load_before[0], 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "pods": len(plans),
        "extended_pods": sum(p.template == EXTENDED for p in plans),
        "bound": sum(bool(p.node) for p in plans),
        "running": running,
        **counts,
        "pods_per_s": round(running / max(bench.last_running - bench.first_create, 1e-9), 1),
        "all_done_s": round(span_s, 1),
        "scheduling_failures": len(scheduler.failures),
        "scheduling_failures_why": dict(
            Counter(_gist(m) for _, m in scheduler.failures).most_common(5)
        ),
        "leases_leaked": len(measured.leases),
        "wrong_injections": len(bench.wrong),
        "unverified": len(bench.unverified),
        "overcommit": len(bench.overcommit_ledger) + len(bench.overcommit_api),
        "overcommit_ledger": len(bench.overcommit_ledger),
        "overcommit_api": len(bench.overcommit_api),
        "ledger_reads": bench.ledger_reads,
        "api_samples": bench.api_samples,
        "lost": len(lost),
        "lost_why": dict(Counter(p.outcome for p in lost).most_common(5)),
        "cpu_ms_per_pod": measured.churn_cpu,
        **cpu_figures(min(counts["prepared"], counts["unprepared"]), measured, span_s),
        **measured.slices,
    }
    result["targets"] = _targets(result)
    for line in (bench.wrong + bench.overcommit_ledger + bench.overcommit_api)[:10]:
        say(f"finding: {line}")
    return result


def _targets(result: Obj) -> Obj:
    keys = ("leases_leaked", "wrong_injections", "unverified", "overcommit", "lost")
    return {
        "correct": all(result[k] == 0 for k in keys),
        "cpu_within_3x_noop": result["cpu_ratio"] <= 3.0,
        "slice_writes_at_most_1_per_s": result["slice_writes_per_node_per_s_max"] <= 1,
    }


def _gist(message: str) -> str:
    """A FailedScheduling message without its names and numbers, to count alike ones."""
    words = [w for w in message.split() if not any(c.isdigit() for c in w)]
    return " ".join(words)[:80]
