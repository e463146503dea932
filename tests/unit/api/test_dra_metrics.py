"""The DRA driver's metrics, as a scrape shows them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from agent.api.dra_metrics import DraCollector, DraStats, LatencyHistogram


def test_each_counter_lands_in_its_family_and_label() -> None:
    stats = DraStats(
        registered=True, prepared=7, prepare_errors=2, unprepared=6, unprepare_errors=1,
        admitted=9, refused=3, slice_writes=11, slice_generation=5, reconcile_released=4,
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(DraCollector(lambda: stats))
    value = registry.get_sample_value
    assert value("gpushare_dra_registered") == 1.0
    assert value("gpushare_dra_prepares_total", {"result": "done"}) == 7.0
    assert value("gpushare_dra_prepares_total", {"result": "error"}) == 2.0
    assert value("gpushare_dra_unprepares_total", {"result": "error"}) == 1.0
    assert value("gpushare_dra_binding_answers_total", {"condition": "admitted"}) == 9.0
    assert value("gpushare_dra_binding_answers_total", {"condition": "refused"}) == 3.0
    assert value("gpushare_dra_slice_writes_total") == 11.0
    assert value("gpushare_dra_slice_generation") == 5.0
    assert value("gpushare_dra_reconcile_released_total") == 4.0


def test_prepare_latency_is_a_histogram_of_the_handlers_calls() -> None:
    latency = LatencyHistogram((0.01, 0.1))
    for seconds in (0.004, 0.01, 0.05, 3.0):
        latency.observe(seconds)
    assert latency.cumulative() == [("0.01", 2), ("0.1", 3), ("+Inf", 4)]
    stats = DraStats(
        registered=True, prepared=0, prepare_errors=0, unprepared=0, unprepare_errors=0,
        admitted=0, refused=0, slice_writes=0, slice_generation=0, reconcile_released=0,
        prepare_latency=latency,
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(DraCollector(lambda: stats))
    value = registry.get_sample_value
    assert value("gpushare_dra_prepare_seconds_bucket", {"le": "0.01"}) == 2.0
    assert value("gpushare_dra_prepare_seconds_bucket", {"le": "+Inf"}) == 4.0
    assert value("gpushare_dra_prepare_seconds_count") == 4.0
    assert value("gpushare_dra_prepare_seconds_sum") == 3.064
