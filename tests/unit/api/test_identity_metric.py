"""gpushare_lease_identity_mismatches_total: a node-wide counter from the snapshot."""

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.api.collector import AgentCollector, TelemetryStats
from agent.core.snapshot import NodeSnapshot


def mismatches(snapshot: NodeSnapshot) -> list[tuple[str, float]]:
    registry = CollectorRegistry()
    stats = TelemetryStats("simulated", 0, 0)
    registry.register(AgentCollector(lambda: snapshot, lambda: stats, clock=lambda: 1.0))
    text = generate_latest(registry).decode()
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "gpushare_lease_identity_mismatches"
    ]
    assert family.type == "counter"
    return [(s.name, s.value) for s in family.samples if s.name.endswith("_total")]


def test_identity_mismatches_are_a_node_wide_counter() -> None:
    snapshot = NodeSnapshot("n1", simulated=True, taken_at=1.0, devices=())
    assert mismatches(snapshot) == [("gpushare_lease_identity_mismatches_total", 0.0)]
    counted = NodeSnapshot(
        "n1", simulated=True, taken_at=1.0, devices=(), lease_identity_mismatches_total=3
    )
    assert mismatches(counted) == [("gpushare_lease_identity_mismatches_total", 3.0)]
