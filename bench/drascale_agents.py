"""What ``bench/dra.py --scale`` measures of each agent: its CPU time and memory, the Prepare
times the harness saw, and the agent's own Prepare histogram (``/metrics``)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from tests.kubeworld.cluster.dra import DraCluster

PREPARE_HISTOGRAM = "gpushare_dra_prepare_seconds"

# -- per agent ---------------------------------------------------------------------------------


def _process(cluster: DraCluster, node: str) -> psutil.Process | None:
    popen = cluster.nodes[node].process
    try:
        return psutil.Process(popen.pid) if popen is not None else None
    except psutil.Error:
        return None


def agent_cpu_s(cluster: DraCluster) -> dict[str, float]:
    """Each node's agent process (and its children): CPU seconds so far."""
    found = {}
    for node in cluster.nodes:
        process, total = _process(cluster, node), 0.0
        if process is None:
            continue
        with contextlib.suppress(psutil.Error):
            for each in (process, *process.children(recursive=True)):
                times = each.cpu_times()
                total += times.user + times.system
        found[node] = total
    return found


def agent_rss(cluster: DraCluster) -> dict[str, int]:
    found = {}
    for node in cluster.nodes:
        process = _process(cluster, node)
        if process is not None:
            with contextlib.suppress(psutil.Error):
                found[node] = process.memory_info().rss
    return found


def part_of(command: list[str]) -> str:
    """Agents, a DRA controller process if the cluster runs one, or anything else."""
    text = " ".join(command)
    if "serve" in command:
        return "agents"
    if "dracontrol" in text or "controller" in text:
        return "controller"
    return "other"


@dataclass
class PrepareTimes:
    """Each NodePrepareResources, timed around the kubelet stand-in's gRPC call."""

    on: bool = False
    ms: list[float] = field(default_factory=list)

    def wrap(self, cluster: DraCluster) -> None:
        for node in cluster.nodes.values():
            kubelet = node.kubelet
            call = kubelet._call

            async def timed(driver: str, method: str, claims: Any, call: Any = call) -> Any:
                started = time.perf_counter()
                try:
                    return await call(driver, method, claims)
                finally:
                    if self.on and method == "NodePrepareResources":
                        self.ms.append(1e3 * (time.perf_counter() - started))

            setattr(kubelet, "_call", timed)  # noqa: B010 (an instance's method, replaced)


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(share * len(ordered)) - 1)], 2)


# -- the agents' own Prepare histogram -----------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` loopback ports, distinct, free now: each bound to 127.0.0.1:0 (the kernel
    picks), all held at once so that none is picked twice, then let go for the agents."""
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(socket.socket()) for _ in range(count)]
        for each in held:
            each.bind(("127.0.0.1", 0))
        return [int(each.getsockname()[1]) for each in held]


@dataclass
class Histogram:
    """A Prometheus histogram as scraped: upper bound in seconds (``math.inf`` for
    ``+Inf``) -> calls at or under it (cumulative), and the sum of their times."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum_s: float = 0.0

    @property
    def count(self) -> float:
        return self.buckets.get(math.inf, 0.0)

    def __add__(self, other: Histogram) -> Histogram:
        bounds = {*self.buckets, *other.buckets}
        return Histogram(
            {b: self.buckets.get(b, 0.0) + other.buckets.get(b, 0.0) for b in bounds},
            self.sum_s + other.sum_s,
        )

    def __sub__(self, other: Histogram) -> Histogram:
        return Histogram(
            {b: n - other.buckets.get(b, 0.0) for b, n in self.buckets.items()},
            self.sum_s - other.sum_s,
        )

    def quantile_ms(self, share: float) -> float | None:
        """The upper bound (ms) of the first bucket whose cumulative count reaches ``share``
        of the calls: to the bucket resolution (1, 2, 5, 10, 20, 50 ms, ...), so never less
        than the true quantile and up to that bucket's width above it; None with no calls,
        or where it lies above the last finite bound."""
        total = self.count
        if total <= 0:
            return None
        for bound in sorted(self.buckets):
            if self.buckets[bound] >= share * total:
                return None if math.isinf(bound) else round(1e3 * bound, 3)
        return None

    def mean_ms(self) -> float | None:
        return round(1e3 * self.sum_s / self.count, 3) if self.count > 0 else None


def parse_histogram(text: str, name: str) -> Histogram:
    """The histogram ``name`` in a Prometheus text exposition (empty where it is absent)."""
    found = Histogram()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                found.buckets[float(sample.labels["le"])] = float(sample.value)
            elif sample.name == f"{name}_sum":
                found.sum_s = float(sample.value)
    return found


async def prepare_histograms(cluster: DraCluster) -> dict[str, Histogram]:
    """Each agent's ``gpushare_dra_prepare_seconds``, read from its /metrics."""

    async def one(session: aiohttp.ClientSession, address: str) -> Histogram:
        async with session.get(f"http://{address}/metrics") as response:
            response.raise_for_status()
            return parse_histogram(await response.text(), PREPARE_HISTOGRAM)

    listening = {n: node.http_listen for n, node in cluster.nodes.items() if node.http_listen}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        read = await asyncio.gather(*(one(session, a) for a in listening.values()))
    return dict(zip(listening, read, strict=True))
