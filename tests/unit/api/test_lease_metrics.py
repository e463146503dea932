"""Per-lease metrics: one row per live lease from the snapshot and the used memory (a
table), and the families the collector builds from them at scrape time."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.api.collector import AgentCollector, TelemetryStats
from agent.api.lease_metrics import LeaseRow, lease_rows, split_pod
from agent.core.lease import Lease, LeaseState
from agent.core.snapshot import NodeSnapshot
from agent.core.types import Device, PriorityClass
from agent.core.units import GIB

DEVICE = Device("GPU-a", 0, "H100", 80 * GIB)


def lease(lease_id: str, **changes: object) -> Lease:
    base = Lease(
        lease_id, f"r-{lease_id}", "t", "t", "GPU-a", PriorityClass.BURSTABLE, 4 * GIB, 25,
        LeaseState.READY, 1.0, 1.0, pod=f"team-a/{lease_id}-0",
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def snapshot(*leases: Lease, estimates: dict[str, float] | None = None) -> NodeSnapshot:
    return NodeSnapshot(
        node_name="n1",
        simulated=True,
        taken_at=1.0,
        devices=(DEVICE,),
        leases=leases,
        retention_estimates=estimates or {},
    )


def row(lease_id: str, **changes: object) -> LeaseRow:
    base = LeaseRow(lease_id, f"{lease_id}-0", "team-a", "GPU-a", "ready", 4 * GIB, 0, 25, None)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ("team-a/train-42-0", ("team-a", "train-42-0")),
        ("", ("", "")),
        ("default/x", ("default", "x")),
    ],
)
def test_split_pod(pod: str, expected: tuple[str, str]) -> None:
    assert split_pod(pod) == expected


@pytest.mark.parametrize(
    ("leases", "used", "estimates", "expected"),
    [
        ([], {}, {}, []),
        # no process attributed: 0 bytes in use, no estimate: none
        ([lease("a")], {}, {}, [row("a")]),
        (
            [lease("a")],
            {"a": 3 * GIB},
            {"a": 0.8},
            [row("a", memory_used_bytes=3 * GIB, retention_estimate=0.8)],
        ),
        # used memory of a lease that ended meanwhile is not shown
        ([lease("a")], {"gone": GIB}, {}, [row("a")]),
        # not a pod's lease: empty pod and namespace labels
        ([lease("a", pod="")], {}, {}, [row("a", pod="", namespace="")]),
        (
            [lease("b", state=LeaseState.ADMITTED, thread_pct=50.0), lease("a")],
            {"b": GIB},
            {"a": 1.0, "b": 0.9},
            [
                row("a", retention_estimate=1.0),
                row("b", state="admitted", threads_pct=50.0, memory_used_bytes=GIB,
                    retention_estimate=0.9),
            ],
        ),
    ],
)  # fmt: skip
def test_lease_rows(
    leases: list[Lease],
    used: dict[str, int],
    estimates: dict[str, float],
    expected: list[LeaseRow],
) -> None:
    assert lease_rows(snapshot(*leases, estimates=estimates), used) == expected


def scrape(node: NodeSnapshot, used: dict[str, int]) -> dict[str, list]:  # type: ignore[type-arg]
    registry = CollectorRegistry()
    stats = TelemetryStats("simulated", 0, 0)
    registry.register(AgentCollector(lambda: node, lambda: stats, lease_memory=lambda: used))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_the_families_carry_one_series_per_live_lease() -> None:
    node = snapshot(lease("a", state=LeaseState.ADMITTED), estimates={"a": 0.75})
    families = scrape(node, {"a": 2 * GIB})
    labels = {"lease": "a", "pod": "a-0", "namespace": "team-a", "device": "GPU-a"}
    for name, value in (
        ("gpushare_lease_memory_limit_bytes", 4 * GIB),
        ("gpushare_lease_memory_used_bytes", 2 * GIB),
        ("gpushare_lease_threads_pct", 25),
        ("gpushare_lease_retention_estimate_ratio", 0.75),
    ):
        assert [(s.labels, s.value) for s in families[name]] == [(labels, value)], name
    states = {s.labels["state"]: s.value for s in families["gpushare_lease_state"]}
    assert states == {"reserved": 0, "admitted": 1, "ready": 0}
    assert all(s.labels.items() >= labels.items() for s in families["gpushare_lease_state"])


def test_no_live_lease_no_series() -> None:
    families = scrape(snapshot(), {"ended": GIB})
    for name in (
        "gpushare_lease_memory_limit_bytes",
        "gpushare_lease_memory_used_bytes",
        "gpushare_lease_threads_pct",
        "gpushare_lease_retention_estimate_ratio",
        "gpushare_lease_state",
    ):
        assert families.get(name, []) == [], name
