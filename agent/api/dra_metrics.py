"""Prometheus metrics of the DRA driver (``dra.enabled``), collected at scrape time from its
counters: is the kubelet plugin registered, how its Prepares, Unprepares and binding
answers went, how often the node's ResourceSlice was written, what the reconcile ended."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

PREPARE_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


class LatencyHistogram:
    """Call latencies in fixed buckets (seconds), as Prometheus histograms count them."""

    def __init__(self, bounds_s: tuple[float, ...] = PREPARE_BUCKETS_S) -> None:
        self.bounds_s = bounds_s
        self._counts = [0] * (len(bounds_s) + 1)  # the last: above every bound
        self.sum_s = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        index = next((i for i, b in enumerate(self.bounds_s) if seconds <= b), len(self.bounds_s))
        self._counts[index] += 1
        self.sum_s += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, calls at or under it), ``+Inf`` last."""
        out, total = [], 0
        for bound, n in zip([*map(str, self.bounds_s), "+Inf"], self._counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(frozen=True, slots=True)
class DraStats:
    registered: bool  # the kubelet's last word on the registration was yes
    prepared: int  # claims answered with their devices
    prepare_errors: int  # claims answered with an error
    unprepared: int
    unprepare_errors: int
    admitted: int  # shares answered gpushare.io/admitted at their binding
    refused: int  # shares answered gpushare.io/refused
    slice_writes: int  # creates, updates and deletes of the node's ResourceSlice sent
    slice_generation: int
    reconcile_released: int  # leases the reconcile released (shares gone from the node)
    prepare_latency: LatencyHistogram | None = None  # NodePrepareResources, in the handler


class DraCollector(Collector):
    def __init__(self, stats: Callable[[], DraStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield GaugeMetricFamily(
            "gpushare_dra_registered",
            "1 when the kubelet accepted the DRA plugin's registration.",
            value=1.0 if s.registered else 0.0,
        )
        yield _by_result(
            "gpushare_dra_prepares", "NodePrepareResources claims", s.prepared, s.prepare_errors
        )
        yield _by_result(
            "gpushare_dra_unprepares",
            "NodeUnprepareResources claims",
            s.unprepared,
            s.unprepare_errors,
        )
        answers = CounterMetricFamily(
            "gpushare_dra_binding_answers",
            "Shares answered at their binding, by the condition written.",
            labels=["condition"],
        )
        answers.add_metric(["admitted"], float(s.admitted))
        answers.add_metric(["refused"], float(s.refused))
        yield answers
        yield CounterMetricFamily(
            "gpushare_dra_slice_writes",
            "Writes of the node's ResourceSlice (creates, updates, deletes).",
            value=float(s.slice_writes),
        )
        yield GaugeMetricFamily(
            "gpushare_dra_slice_generation",
            "The pool generation of the node's ResourceSlice as last written.",
            value=float(s.slice_generation),
        )
        if s.prepare_latency is not None:
            yield HistogramMetricFamily(
                "gpushare_dra_prepare_seconds",
                "NodePrepareResources calls by how long the handler took, from request to answer.",
                buckets=s.prepare_latency.cumulative(),
                sum_value=s.prepare_latency.sum_s,
            )
        yield CounterMetricFamily(
            "gpushare_dra_reconcile_released",
            "Leases released by the claim reconcile (their share no longer allocated here).",
            value=float(s.reconcile_released),
        )


def _by_result(name: str, what: str, done: int, errors: int) -> CounterMetricFamily:
    family = CounterMetricFamily(name, f"{what} answered, by result.", labels=["result"])
    family.add_metric(["done"], float(done))
    family.add_metric(["error"], float(errors))
    return family
