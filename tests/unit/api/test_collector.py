from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.api.collector import AgentCollector, TelemetryStats
from agent.core.mpsstate import MpsDaemonState, MpsServerState
from agent.core.samples import Sample
from agent.core.snapshot import NodeSnapshot
from agent.core.types import Device


def scrape(snapshot: NodeSnapshot, stats: TelemetryStats, now: float) -> dict[str, list]:
    registry = CollectorRegistry()
    registry.register(AgentCollector(lambda: snapshot, lambda: stats, clock=lambda: now))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_families_follow_the_live_state() -> None:
    devices = (Device("GPU-a", 0, "H100", 80), Device("GPU-b", 1, "H100", 40))
    snapshot = NodeSnapshot(
        node_name="n1",
        simulated=True,
        taken_at=100.0,
        devices=devices,
        mps=(
            MpsDaemonState(
                "GPU-a",
                up=True,
                backend="simulated",
                restarts=2,
                defaults_drift_total=1,
                servers=(MpsServerState(9, (10, 11)),),
            ),
            MpsDaemonState("GPU-b", up=False, backend="simulated"),
        ),
        latest_samples=(Sample("GPU-a", 97.5, {}),),
    )
    families = scrape(snapshot, TelemetryStats("simulated", 12, 3), now=100.0)

    memory = {s.labels["device"]: s.value for s in families["gpushare_device_memory_bytes"]}
    assert memory == {"GPU-a": 80, "GPU-b": 40}
    up = {s.labels["device"]: s.value for s in families["gpushare_mps_daemon_up"]}
    assert up == {"GPU-a": 1.0, "GPU-b": 0.0}
    (age,) = families["gpushare_telemetry_sample_age_seconds"]
    assert age.value == 2.5
    samples = {s.name: s.value for s in families["gpushare_telemetry_samples"]}
    assert samples["gpushare_telemetry_samples_total"] == 12
    errors = {s.name: s.value for s in families["gpushare_telemetry_errors"]}
    assert errors["gpushare_telemetry_errors_total"] == 3
    (info,) = families["gpushare_build_info"]
    assert info.labels["simulated"] == "true" and info.labels["node"] == "n1"

    restarts = {
        s.labels["device"]: s.value
        for s in families["gpushare_mps_daemon_restarts"]
        if s.name.endswith("_total")
    }
    assert restarts == {"GPU-a": 2, "GPU-b": 0}
    drift = {
        s.labels["device"]: s.value
        for s in families["gpushare_mps_defaults_drift"]
        if s.name.endswith("_total")
    }
    assert drift == {"GPU-a": 1, "GPU-b": 0}
    clients = {s.labels["device"]: s.value for s in families["gpushare_mps_clients"]}
    assert clients == {"GPU-a": 2, "GPU-b": 0}


def test_pipe_permission_violations_are_a_counter_per_device() -> None:
    from agent.core.mpsstate import MpsDaemonState

    snapshot = NodeSnapshot(
        node_name="n1",
        simulated=True,
        taken_at=100.0,
        devices=(Device("GPU-a", 0, "H100", 80), Device("GPU-b", 1, "H100", 80)),
        mps=(
            MpsDaemonState("GPU-a", up=True, backend="b", pipe_permission_violations_total=3),
            MpsDaemonState("GPU-b", up=True, backend="b"),
        ),
    )
    families = scrape(snapshot, TelemetryStats("simulated", 0, 0), now=100.0)
    violations = {
        s.labels["device"]: s.value
        for s in families["gpushare_mps_pipe_permission_violations"]
        if s.name == "gpushare_mps_pipe_permission_violations_total"
    }
    assert violations == {"GPU-a": 3, "GPU-b": 0}
