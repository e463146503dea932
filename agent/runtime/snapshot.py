"""The node at one instant, as the API and the metrics see it (``App.snapshot``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from agent.control.loops import ControlLoops
from agent.control.readiness import ineffective_ratio
from agent.core.mpsstate import MpsDaemonState
from agent.core.snapshot import AdmissionStats, DeviceLedger, GoneDevice, NodeSnapshot
from agent.core.types import Device
from agent.gpu.port import TelemetrySource
from agent.gpu.sampler import Sampler
from agent.learning.learner import NodeLearning
from agent.node.events import EventLog
from agent.node.service import NodeService


@dataclass(frozen=True, slots=True)
class Fixed:
    """What the App knows of the node from its construction on."""

    node_name: str
    simulated: bool
    clock: Callable[[], float]
    events: EventLog
    mps_states: Callable[[], Iterable[MpsDaemonState]]
    stale: Callable[[], list[str]]
    estimates: Callable[[], dict[str, float]]


@dataclass(frozen=True, slots=True)
class Live:
    """The parts the App starts (None until they are)."""

    devices: Sequence[Device]
    node: NodeService | None
    control: ControlLoops | None
    learning: NodeLearning | None
    sampler: Sampler | None
    telemetry: TelemetrySource | None
    injector: str


def take(fixed: Fixed, live: Live, *, ledger_only: bool = False) -> NodeSnapshot:
    """The whole node, or (``ledger_only``) only what admission decides by: the devices,
    leases, ledger and gone devices (GetNodeRequest.ledger_only)."""
    sampler, node, control = live.sampler, live.node, live.control
    leases = tuple(node.leases.values()) if node else ()
    ledger: tuple[DeviceLedger, ...] = ()
    gone: tuple[GoneDevice, ...] = ()
    stranded_bytes, stranded_pct = 0, 0.0
    if node is not None:
        ledger, gone = node.device_ledgers(), node.gone_devices()
    if ledger_only:
        return NodeSnapshot(
            node_name=fixed.node_name,
            simulated=fixed.simulated,
            taken_at=fixed.clock(),
            devices=tuple(live.devices),
            leases=leases,
            ledger=ledger,
            gone_devices=gone,
            last_event_seq=fixed.events.last_seq,
            injector=live.injector,
        )
    if node is not None:
        stranded = node.stranded()
        stranded_bytes, stranded_pct = stranded.memory_bytes, stranded.thread_pct
    return NodeSnapshot(
        node_name=fixed.node_name,
        simulated=fixed.simulated,
        taken_at=fixed.clock(),
        devices=tuple(live.devices),
        mps=tuple(fixed.mps_states()),
        latest_samples=tuple(sampler.latest() if sampler else ()),
        latest_windows=tuple(sampler.latest_windows() if sampler else ()),
        telemetry_source=live.telemetry.name if live.telemetry else "",
        stale_devices=tuple(fixed.stale()),
        leases=leases,
        ledger=ledger,
        gone_devices=gone,
        stranded_memory_bytes=stranded_bytes,
        stranded_thread_pct=stranded_pct,
        last_event_seq=fixed.events.last_seq,
        admission=node.admission_stats() if node else AdmissionStats(),
        retention_estimates=fixed.estimates(),
        ineffective_ratio=ineffective_ratio(leases, live.devices),
        injector=live.injector,
        control_actions=dict(control.actions) if control else {},
        degraded_devices=tuple(control.degradation.degraded()) if control else (),
        lease_identity_mismatches_total=(
            control.janitor.attributor.mismatches_total if control else 0
        ),
        estimator_node_records_total=(
            live.learning.recorder.records_total if live.learning is not None else 0
        ),
    )


def lease_memory_used(control: ControlLoops | None) -> dict[str, int]:
    """NVML's used memory of each lease's processes, summed, as of the janitor's last pass
    (a lease with no process attributed, or none whose memory NVML reports, is not in it)."""
    return dict(control.janitor.memory_used_bytes) if control else {}
