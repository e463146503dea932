"""The DRA driver's metrics, as a scrape shows them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from agent.api.dra_metrics import DraCollector, DraStats


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
