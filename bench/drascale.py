"""``bench/dra.py --scale``: the DRA run of bench/dra.py at several cluster sizes, the same
pods per node each time, with ``--foreign-claims`` ResourceClaims of other nodes standing
in the API server (allocated to nodes outside the cluster, in a namespace of their own).

For each node count, one cluster (tests/kubeworld/cluster/dra.py), in order:

1. the agents started (each with its HTTP listener on a loopback port of its own, for its
   /metrics); ``--settle-s``; each agent's RSS read (``without``);
2. the foreign claims put in at once (``FakeApiServer.put_objects``: as though they had
   stood there before every watch; each watch is ended and its client lists again);
   ``--settle-s``; each agent's RSS read again (``with``): the growth is with less without;
3. each agent's CPU over ``--idle-s`` (10 s unless given: several of its 1 s reconcile
   passes, and the 10 ms ticks of the CPU clock a small part) while nothing is asked of it:
   its idle rate;
4. the quiet node: ``--quiet-pods`` pods run, then, on the node most of them landed on,
   each of its claims Unprepared and Prepared straight on its plugin (``--quiet-cycles``
   times, more where needed for 100 pairs), that agent's CPU measured; then
   ``--noop-calls`` Pings to that agent alone (``--noop-callers`` callers), its CPU
   measured: ``cpu_ratio_quiet`` is the one over the other (per pair, per call);
5. the churn of bench/dra.py: ``--pods-per-node`` pods per node, created at a steady
   ``--pods-per-node-per-s`` a node (so that each agent gets the same work a second at
   every size, and its time-based costs the same share of a pod; 0: as fast as the
   harness goes, which on few cores is slower a node at more nodes), at most
   ``--window-per-node`` per node waiting unbound, every check of bench/dra.py (ledger reads
   every ``--sample-s``, 5 s at least here, and one per pod); each agent's CPU over the
   churn less its idle rate times the same span (from the one CPU reading to the other),
   over the pods that ran on its node; NodePrepareResources timed in the agent's handler,
   from each agent's ``gpushare_dra_prepare_seconds`` histogram on its /metrics, read
   before the churn and after it, the buckets' growth summed over the agents (its p50 and
   p99 to the histogram's bucket resolution: ``prepare_timed_at`` says so); and around the
   kubelet stand-in's gRPC call (``..._kubelet_...``: the gRPC round trip and the
   harness's event loop, shared with everything else, on top);
6. after two reconcile passes: leases and claims left, as bench/dra.py counts them.

The API stand-in counts, for each agent's token (``dra-api-token-<node>``), the bytes of
every ResourceClaim it sent that agent (list items, single objects, watch events) whose
allocation never named that agent's node: ``foreign_claim_bytes_read_max`` is the most of
any agent of any run; the binding-answer controller's token (``dra-api-token-controller``)
is counted the same way (``controller_watch_bytes_...``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.client import AgentClient
from bench.cpu import cpu_by_part
from bench.dra import Bench, _churn, _keep_logs, agent_settings
from bench.dra_figures import Measured, _phase, summarize
from bench.dra_plan import NAMESPACE, TEMPLATES, plan_pods, say
from bench.drascale_agents import (
    Histogram,
    PrepareTimes,
    agent_cpu_s,
    agent_rss,
    free_ports,
    part_of,
    percentile,
    prepare_histograms,
)
from tests.kubeworld.apiserver import FakeApiServer, Obj
from tests.kubeworld.cluster.dra import DraCluster, claim_pod, claim_template, dra_cluster

FOREIGN_NAMESPACE = "other-teams"
FOREIGN_NODES = 1000  # the foreign claims are spread over this many nodes outside the cluster
QUIET_PAIRS = 100  # at least, on the quiet node (CPU times tick every 10 ms)
UPSTREAM_PREPARE_P99_MS = 100.0  # upstream's published p99 of NodePrepareResources
CORRECT = (
    "leases_leaked",
    "wrong_injections",
    "unverified",
    "overcommit",
    "overcommit_ledger",
    "overcommit_api",
    "lost",
    "unprepare_errors",
    "quiet_failed",
)
SUMMED = ("pods", "extended_pods", "bound", "running", "prepared", "unprepared")


def foreign_claim(index: int) -> Obj:
    """A claim of a pod on a node outside the cluster: allocated one share of a GPU there,
    reserved for its pod, its binding answered."""
    node = f"other-node-{index % FOREIGN_NODES:04d}"
    memory, threads = TEMPLATES[sorted(TEMPLATES)[index % len(TEMPLATES)]]
    consumed = {"memory": memory, "threads": threads}
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpushare.io", "capacity": {"requests": consumed}},
    }
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    result = {
        "request": "gpu",
        "driver": "gpushare.io",
        "pool": node,
        "device": f"gpu-{index % 4}",
        "shareID": str(uuid.UUID(int=index + 1)),
        "consumedCapacity": consumed,
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"other-{index:06d}-gpu", "namespace": FOREIGN_NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": [term]},
            },
            "reservedFor": [
                {"resource": "pods", "name": f"other-{index:06d}", "uid": str(uuid.UUID(int=index))}
            ],
        },
    }


# -- one cluster size ----------------------------------------------------------------------------


@dataclass
class Run:
    nodes: int
    start_s: float = 0.0
    foreign_put_s: float = 0.0
    rss_without: dict[str, int] = field(default_factory=dict)
    rss_with: dict[str, int] = field(default_factory=dict)
    idle_s_per_s: dict[str, float] = field(default_factory=dict)
    quiet: Obj = field(default_factory=dict)
    churn_cpu: dict[str, float] = field(default_factory=dict)  # node -> CPU s over the churn
    churn_s: float = 0.0
    controller_s: float | None = None
    cpu_span_s: float = 0.0  # from the CPU reading before the churn to the one after
    pods_on: Counter[str] = field(default_factory=Counter)
    prepare_ms: list[float] = field(default_factory=list)  # at the kubelet stand-in
    prepare_handler: Histogram = field(default_factory=Histogram)  # the agents', summed
    reads: dict[str, Obj] = field(default_factory=dict)  # node -> what the API sent it
    controller_reads: Obj | None = None
    controller_watch_bytes_churn: int | None = None
    controller_counters: Obj | None = None  # its own counters' growth over the churn
    summary: Obj = field(default_factory=dict)  # bench/dra.py's figures of this run


def _sized(args: argparse.Namespace, nodes: int) -> argparse.Namespace:
    sized = argparse.Namespace(**vars(args))
    sized.nodes = nodes
    sized.pods = args.pods_per_node * nodes
    sized.window = args.window_per_node * nodes
    sized.create_per_s = args.pods_per_node_per_s * nodes
    sized.sample_s = max(args.sample_s, 5.0)
    return sized


async def one_size(args: argparse.Namespace, root: Path, nodes: int) -> Run:
    sized = _sized(args, nodes)
    rng = random.Random(args.seed)
    plans = plan_pods(sized, rng)
    run = Run(nodes)
    ports = iter(free_ports(nodes))
    started = time.monotonic()
    async with dra_cluster(
        root,
        nodes=nodes,
        settings=agent_settings(sized),
        start_timeout_s=600.0,
        http_listen=lambda _node: f"127.0.0.1:{next(ports)}",
    ) as cluster:
        run.start_s = time.monotonic() - started
        say(f"{nodes} nodes up in {run.start_s:.0f} s; {sized.pods} pods to go")
        bench = Bench(sized, cluster, plans)
        try:
            await _measure(bench, run, rng)
        finally:
            _keep_logs(sized, cluster)
    return run


async def _measure(bench: Bench, run: Run, rng: random.Random) -> None:
    args, cluster, server = bench.args, bench.cluster, bench.server
    assert cluster.scheduler is not None
    cluster.scheduler.rng = random.Random(rng.random())
    for name, (memory, threads) in TEMPLATES.items():
        await cluster.apply(claim_template(name, NAMESPACE, memory=memory, threads=threads))
    load_before = os.getloadavg()
    async with contextlib.AsyncExitStack() as stack:
        for name, node in cluster.nodes.items():
            client = AgentClient(f"unix://{node.socket}", attempts=1, timeout_s=30)
            bench.clients[name] = await stack.enter_async_context(client)
            bench.due[name] = asyncio.Event()
        await asyncio.sleep(args.settle_s)
        run.rss_without = agent_rss(cluster)
        begun = time.monotonic()
        made = map(foreign_claim, range(args.foreign_claims))
        put = server.put_objects("resourceclaims", made, check_each=False)
        run.foreign_put_s = round(time.monotonic() - begun, 2)
        say(f"{put} foreign claims put in {run.foreign_put_s} s")
        await asyncio.sleep(args.settle_s)
        run.rss_with = agent_rss(cluster)
        run.idle_s_per_s = await idle_rates(cluster, args.idle_s)
        run.quiet = await quiet_node(bench, run.idle_s_per_s)
        say(f"quiet node: {run.quiet}")
        timing = PrepareTimes()
        timing.wrap(cluster)
        measured = Measured()
        # read outside the CPU readings: the scrapes are not the churn's
        histograms_before = await prepare_histograms(cluster)
        watch_before = server.client_reads("controller").watch_bytes
        before, cpu_started = agent_cpu_s(cluster), time.monotonic()
        parts_before = cpu_by_part(part_of)
        counters_before = _controller_counters(cluster)
        timing.on = True
        await _churn(bench, measured)
        timing.on = False
        after, run.cpu_span_s = agent_cpu_s(cluster), time.monotonic() - cpu_started
        parts_after = cpu_by_part(part_of)
        histograms_after = await prepare_histograms(cluster)
        if cluster.controller is not None:
            watched = server.client_reads("controller").watch_bytes - watch_before
            run.controller_watch_bytes_churn = watched
        for name, grown in histograms_after.items():
            run.prepare_handler += grown - histograms_before.get(name, Histogram())
        run.churn_s = measured.churn_end - bench.first_create
        run.churn_cpu = {n: after[n] - before.get(n, after[n]) for n in after}
        counters_after = _controller_counters(cluster)
        if counters_before is not None and counters_after is not None:
            run.controller_counters = {
                k: v - counters_before.get(k, 0) for k, v in counters_after.items()
            }
        if parts_after.get("controller"):
            run.controller_s = parts_after["controller"] - parts_before.get("controller", 0.0)
        run.prepare_ms = timing.ms
        run.pods_on = Counter(p.node for p in bench.plans if p.running_at > 0)
        say("churn done; waiting for the claim reconcile to pass twice")
        await asyncio.sleep(2 * args.reconcile_s + 1.0)
        measured.leases = await bench.live_leases()
        measured.left_claims = server.objects("resourceclaims", NAMESPACE)
    measured.idle_ms_per_s = round(1e3 * sum(run.idle_s_per_s.values()), 2)
    measured.quiet = run.quiet
    measured.noop = run.quiet["noop"]
    run.reads = {n: _reads(server, n) for n in cluster.nodes}
    if "controller" in server.reads:
        run.controller_reads = _reads(server, "controller")
    run.summary = summarize(bench, measured, load_before)


def _controller_counters(cluster: DraCluster) -> dict[str, int] | None:
    """The binding-answer controller's counters, where the cluster runs one in-process."""
    controller = getattr(cluster, "controller", None)
    counters = getattr(controller, "counters", None)
    if counters is None:
        return None
    return {k: v for k, v in vars(counters).items() if isinstance(v, int)}


def _reads(server: FakeApiServer, client: str) -> Obj:
    reads = server.client_reads(client)
    return {
        "own": reads.own,
        "foreign": reads.foreign,
        "requests": reads.requests,
        "watch_bytes": reads.watch_bytes,
        "watch_claim_bytes": reads.watch_claim_bytes,
    }


async def idle_rates(cluster: DraCluster, seconds: float) -> dict[str, float]:
    """Each agent's CPU seconds per second while nothing is asked of it."""
    before, started = agent_cpu_s(cluster), time.monotonic()
    await asyncio.sleep(seconds)
    after, span = agent_cpu_s(cluster), time.monotonic() - started
    return {n: (after[n] - before.get(n, after[n])) / span for n in after}


async def quiet_node(bench: Bench, idle: dict[str, float]) -> Obj:
    """Prepare+Unprepare pairs on one quiet node against Pings to that node, its agent's
    CPU alone (raw, and less its idle rate)."""
    args, cluster, server = bench.args, bench.cluster, bench.server
    names = [f"quiet-{i}" for i in range(args.quiet_pods)]
    for name in names:
        server.put_object("pods", claim_pod(name, "m8g-t25", NAMESPACE))
    if not await bench.until(lambda: all(_phase(server, n) == "Running" for n in names)):
        stuck = [n for n in names if _phase(server, n) != "Running"]
        raise RuntimeError(f"quiet phase: never Running: {stuck[:5]}")
    claims: dict[str, list[Obj]] = {}
    for name in names:
        pod = server.objects["pods"][(NAMESPACE, name)]
        status = pod.get("status") or {}
        claim_name = (status.get("resourceClaimStatuses") or [{}])[0].get("resourceClaimName")
        claim = server.objects["resourceclaims"][(NAMESPACE, claim_name)]
        claims.setdefault(str(pod["spec"]["nodeName"]), []).append(claim)
    node = max(sorted(claims), key=lambda n: len(claims[n]))
    kubelet, mine = cluster.nodes[node].kubelet, claims[node]
    failures = 0
    cycles = max(args.quiet_cycles, math.ceil(QUIET_PAIRS / len(mine)))
    before, started = agent_cpu_s(cluster)[node], time.monotonic()
    for _ in range(cycles):
        for claim in mine:
            undone = await kubelet.unprepare([claim])
            done = await kubelet.prepare([claim])
            failures += sum(bool(e) for e in undone.values())
            failures += sum(isinstance(r, str) for r in done.values())
    cpu_s, wall_s = agent_cpu_s(cluster)[node] - before, time.monotonic() - started
    noop = await _pings(bench, node)
    for name in names:
        server.delete_pod(NAMESPACE, name, force=True)
    await bench.until(lambda: not any((NAMESPACE, n) in server.objects["pods"] for n in names))
    pairs = len(mine) * cycles
    pair_ms = 1e3 * cpu_s / max(pairs, 1)
    noop_ms = 1e3 * noop["cpu_s"] / max(noop["calls"], 1)
    busy_pair_ms = 1e3 * (cpu_s - idle.get(node, 0.0) * wall_s) / max(pairs, 1)
    busy_noop_ms = 1e3 * (noop["cpu_s"] - idle.get(node, 0.0) * noop["wall_s"]) / noop["calls"]
    return {
        "node": node,
        "pairs": pairs,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "failed": failures,
        "noop": noop,
        "pair_ms": round(pair_ms, 3),
        "noop_ms": round(noop_ms, 3),
        "ratio": round(pair_ms / max(noop_ms, 1e-9), 2),
        "ratio_idle_subtracted": round(busy_pair_ms / max(busy_noop_ms, 1e-9), 2),
    }


async def _pings(bench: Bench, node: str) -> Obj:
    args, client = bench.args, bench.clients[node]
    per_caller = max(1, args.noop_calls // args.noop_callers)

    async def caller() -> None:
        for _ in range(per_caller):
            await client.ping()

    before, started = agent_cpu_s(bench.cluster)[node], time.monotonic()
    await asyncio.gather(*(caller() for _ in range(args.noop_callers)))
    cpu_s, wall_s = agent_cpu_s(bench.cluster)[node] - before, time.monotonic() - started
    return {"calls": per_caller * args.noop_callers, "cpu_s": cpu_s, "wall_s": wall_s}


# -- all sizes -----------------------------------------------------------------------------------


def _busy_s(run: Run, node: str) -> float:
    """The agent's CPU over the churn less its idle rate times the time between the two
    CPU readings (the span its CPU was measured over, not the churn's own, a little less)."""
    return run.churn_cpu[node] - run.idle_s_per_s.get(node, 0.0) * run.cpu_span_s


def cpu_ms_per_pod(run: Run) -> float | None:
    """All agents' CPU over the churn less each one's idle rate, over the pods run: each
    agent's CPU per pod on its own node, weighted by its pods."""
    pods = sum(run.pods_on.values())
    if not pods:
        return None
    return round(1e3 * sum(_busy_s(run, n) for n in run.churn_cpu) / pods, 3)


def _per_agent(run: Run) -> list[float]:
    return [
        1e3 * _busy_s(run, n) / count
        for n, count in run.pods_on.items()
        if count and n in run.churn_cpu
    ]


def _ratio(by: dict[str, Any], low: int, high: int) -> float | None:
    a, b = by.get(str(low)), by.get(str(high))
    return round(b / a, 3) if a and b is not None else None


async def scale_run(args: argparse.Namespace, root: Path) -> Obj:
    runs: dict[int, Run] = {}
    for nodes in args.scale_nodes:
        say(f"-- {nodes} nodes --")
        where = root / f"s{nodes}"
        where.mkdir()
        runs[nodes] = await one_size(args, where, nodes)
    return scale_summary(args, runs)


def scale_summary(args: argparse.Namespace, runs: dict[int, Run]) -> Obj:
    sizes = sorted(runs)
    low, high = sizes[0], sizes[-1]
    largest = runs[high]
    cpu_by = {str(n): cpu_ms_per_pod(runs[n]) for n in sizes}
    p99_by = {str(n): runs[n].prepare_handler.quantile_ms(0.99) for n in sizes}
    p99_kubelet_by = {str(n): percentile(runs[n].prepare_ms, 0.99) for n in sizes}
    attributed = all(r["requests"] > 0 for run in runs.values() for r in run.reads.values())
    foreign_by = {str(n): max(r["foreign"] for r in runs[n].reads.values()) for n in sizes}
    growth_by = {
        str(n): round(
            max(
                (runs[n].rss_with[a] - runs[n].rss_without[a]) / 2**20
                for a in runs[n].rss_with
                if a in runs[n].rss_without
            ),
            2,
        )
        for n in sizes
    }
    pods_by = {str(n): sum(runs[n].pods_on.values()) for n in sizes}
    controller_cpu_by = {
        str(n): _per_pod(runs[n].controller_s, pods_by[str(n)], 1e3, 3) for n in sizes
    }
    controller_watch_by = {
        str(n): (runs[n].controller_reads or {}).get("watch_bytes") for n in sizes
    }
    controller_bytes_by = {
        str(n): (runs[n].controller_counters or {}).get("bytes_decoded") for n in sizes
    }
    controller_seen_per_pod_by = {
        str(n): _per_pod(
            (runs[n].controller_counters or {}).get("claims_seen"), pods_by[str(n)], 1.0, 2
        )
        for n in sizes
    }
    result: Obj = {**largest.summary}
    for key in (*CORRECT, *SUMMED, "scheduling_failures"):
        result[key] = sum(int(runs[n].summary.get(key) or 0) for n in sizes)
    result.update(
        {
            "scale": True,
            "scale_nodes": sizes,
            "pods_per_node": args.pods_per_node,
            "pods_per_node_per_s": args.pods_per_node_per_s,
            "foreign_claims": args.foreign_claims,
            "pods_by_nodes": pods_by,
            "start_s_by_nodes": {str(n): round(runs[n].start_s, 1) for n in sizes},
            "churn_s_by_nodes": {str(n): round(runs[n].churn_s, 1) for n in sizes},
            "foreign_put_s": largest.foreign_put_s,
            "agent_cpu_ms_per_pod_by_nodes": cpu_by,
            "agent_cpu_ms_per_pod_max_agent_by_nodes": {
                str(n): round(max(_per_agent(runs[n]), default=0.0), 3) for n in sizes
            },
            "agent_cpu_idle_window_s": args.idle_s,
            "agent_cpu_idle_ms_per_s_per_agent_by_nodes": {
                str(n): round(1e3 * sum(runs[n].idle_s_per_s.values()) / n, 2) for n in sizes
            },
            "agent_cpu_ratio_largest_to_smallest": _ratio(cpu_by, low, high),
            "foreign_claim_bytes_read_max": max(foreign_by.values()) if attributed else None,
            "foreign_claim_bytes_read_max_by_nodes": foreign_by if attributed else None,
            "own_claim_bytes_read_max_by_nodes": {
                str(n): max(r["own"] for r in runs[n].reads.values()) for n in sizes
            },
            "claim_reads_attributed": attributed,
            "agent_rss_growth_mib_foreign_claims": max(growth_by.values()),
            "agent_rss_growth_mib_foreign_claims_by_nodes": growth_by,
            "agent_rss_mib_without_by_nodes": {
                str(n): round(max(runs[n].rss_without.values(), default=0) / 2**20, 1)
                for n in sizes
            },
            "prepare_p99_ms": p99_by[str(high)],
            "prepare_p50_ms": largest.prepare_handler.quantile_ms(0.5),
            "prepare_p99_ms_by_nodes": p99_by,
            "prepare_p50_ms_by_nodes": {
                str(n): runs[n].prepare_handler.quantile_ms(0.5) for n in sizes
            },
            "prepare_mean_ms_by_nodes": {str(n): runs[n].prepare_handler.mean_ms() for n in sizes},
            "prepare_calls_by_nodes": {str(n): int(runs[n].prepare_handler.count) for n in sizes},
            "prepare_p99_ratio_largest_to_smallest": _ratio(p99_by, low, high),
            "prepare_timed_at": "handler",
            "prepare_quantiles_resolution": (
                "the upper bound of the histogram bucket where the cumulative count reaches "
                "the share (buckets 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000 ms)"
            ),
            "prepare_p99_ms_kubelet": p99_kubelet_by[str(high)],
            "prepare_p99_ms_kubelet_by_nodes": p99_kubelet_by,
            "prepare_p50_ms_kubelet_by_nodes": {
                str(n): percentile(runs[n].prepare_ms, 0.5) for n in sizes
            },
            "prepare_p99_kubelet_ratio_largest_to_smallest": _ratio(p99_kubelet_by, low, high),
            "prepare_kubelet_timed_at": (
                "kubelet stand-in, around the NodePrepareResources gRPC call"
            ),
            "prepare_p99_ms_upstream": UPSTREAM_PREPARE_P99_MS,
            "cpu_ratio_quiet": largest.quiet["ratio"],
            "cpu_ratio_quiet_idle_subtracted": largest.quiet["ratio_idle_subtracted"],
            "cpu_ratio_quiet_by_nodes": {str(n): runs[n].quiet["ratio"] for n in sizes},
            "agent_cpu_ms_per_prepare_unprepare_quiet": largest.quiet["pair_ms"],
            "agent_cpu_ms_per_noop": largest.quiet["noop_ms"],
            "controller_cpu_ms_per_pod_by_nodes": controller_cpu_by,
            "controller_watch_bytes_by_nodes": controller_watch_by,
            "controller_watch_bytes_during_churn_by_nodes": {
                str(n): runs[n].controller_watch_bytes_churn for n in sizes
            },
            "controller_bytes_decoded_during_churn_by_nodes": controller_bytes_by,
            "controller_claims_seen_per_pod_by_nodes": controller_seen_per_pod_by,
            "controller_counters_during_churn": largest.controller_counters,
        }
    )
    result["targets"] = {
        **largest.summary["targets"],
        "correct": all(result[k] == 0 for k in CORRECT),
        "agent_cpu_per_pod_within_1_25x": _within(result["agent_cpu_ratio_largest_to_smallest"]),
        "foreign_claim_bytes_zero": result["foreign_claim_bytes_read_max"] == 0,
        "rss_growth_at_most_16_mib": result["agent_rss_growth_mib_foreign_claims"] <= 16,
        # to the bucket resolution: within 1.25x means in the same bucket
        "prepare_p99_within_1_25x": _within(result["prepare_p99_ratio_largest_to_smallest"]),
        "prepare_p99_kubelet_within_1_25x": _within(
            result["prepare_p99_kubelet_ratio_largest_to_smallest"]
        ),
        "cpu_ratio_quiet_at_most_8": result["cpu_ratio_quiet"] <= 8,
    }
    return result


def _per_pod(value: float | None, pods: int, scale: float, digits: int) -> float | None:
    return None if value is None else round(scale * value / max(pods, 1), digits)


def _within(ratio: float | None, most: float = 1.25) -> bool | None:
    return None if ratio is None else ratio <= most
