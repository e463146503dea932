"""The node at one instant, as the API and the metrics see it (``App.snapshot``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.core.types import AdmissionStats, DeviceLedger, GoneDevice, NodeSnapshot
from agent.runtime.readiness import ineffective_ratio

if TYPE_CHECKING:
    from agent.runtime.app import App


def injector_of(app: App) -> str:
    """How leases reach the node's containers: the device plugin (or NRI), or the DRA
    driver's CDI specs (saying so while the kubelet has not accepted its registration)."""
    if app.device_plugin is not None:
        return app.device_plugin.injector
    if app.dra is not None:
        registered = app.dra.server.registration.registered
        return "dra" if registered else "dra (not registered with the kubelet)"
    return ""


def take(app: App, *, ledger_only: bool = False) -> NodeSnapshot:
    """The whole node, or (``ledger_only``) only what admission decides by: the devices,
    leases, ledger and gone devices (GetNodeRequest.ledger_only)."""
    sampler, node, control = app.sampler, app.node, app.control
    leases = tuple(node.leases.values()) if node else ()
    ledger: tuple[DeviceLedger, ...] = ()
    gone: tuple[GoneDevice, ...] = ()
    stranded_bytes, stranded_pct = 0, 0.0
    if node is not None:
        ledger, gone = node.device_ledgers(), node.gone_devices()
    if ledger_only:
        return NodeSnapshot(
            node_name=app.settings.runtime.node_name,
            simulated=app.ports.simulated,
            taken_at=app.clock(),
            devices=tuple(app.devices),
            leases=leases,
            ledger=ledger,
            gone_devices=gone,
            last_event_seq=app.events.last_seq,
            injector=injector_of(app),
        )
    if node is not None:
        stranded = node.stranded()
        stranded_bytes, stranded_pct = stranded.memory_bytes, stranded.thread_pct
    return NodeSnapshot(
        node_name=app.settings.runtime.node_name,
        simulated=app.ports.simulated,
        taken_at=app.clock(),
        devices=tuple(app.devices),
        mps=tuple(app.ports.mps.states()),
        latest_samples=tuple(sampler.latest() if sampler else ()),
        latest_windows=tuple(sampler.latest_windows() if sampler else ()),
        telemetry_source=app.telemetry.name if app.telemetry else "",
        stale_devices=tuple(app.stale()),
        leases=leases,
        ledger=ledger,
        gone_devices=gone,
        stranded_memory_bytes=stranded_bytes,
        stranded_thread_pct=stranded_pct,
        last_event_seq=app.events.last_seq,
        admission=node.admission_stats() if node else AdmissionStats(),
        retention_estimates=app.estimates(),
        ineffective_ratio=ineffective_ratio(leases, app.devices),
        injector=injector_of(app),
        control_actions=dict(control.actions) if control else {},
        degraded_devices=tuple(control.degradation.degraded()) if control else (),
        lease_identity_mismatches_total=(
            control.janitor.attributor.mismatches_total if control else 0
        ),
        estimator_node_records_total=(
            app.learning.recorder.records_total if app.learning is not None else 0
        ),
    )


def lease_memory_used(app: App) -> dict[str, int]:
    """NVML's used memory of each lease's processes, summed, as of the janitor's last pass
    (a lease with no process attributed, or none whose memory NVML reports, is not in it)."""
    control = app.control
    return dict(control.janitor.memory_used_bytes) if control else {}
