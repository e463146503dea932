"""Prometheus metrics of the DRA driver (``dra.enabled``), collected at scrape time from its
counters: is the kubelet plugin registered, how its Prepares, Unprepares and binding
answers went, how often the node's ResourceSlice was written, what the reconcile ended."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


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
