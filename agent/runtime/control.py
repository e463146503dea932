"""The control loops that keep a shared node healthy after admission, built from settings:
readiness, the janitor and the degradation monitor. The App starts them once the ledger is
loaded; each is a supervised task, and all count their actions in one place."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.admission.degradation import DegradationRule
from agent.config import Settings
from agent.gpu.port import TelemetrySource
from agent.gpu.sampler import Sampler
from agent.mps.stale import Policy
from agent.runtime.attribution import ProcessAttributor
from agent.runtime.degrade import DegradationMonitor
from agent.runtime.events import EventLog
from agent.runtime.gate import ProfileGate
from agent.runtime.janitor import Janitor
from agent.runtime.node import NodeService
from agent.runtime.readiness import ReadinessWatcher
from agent.runtime.tasks import Supervisor
from agent.runtime.wiring import Ports, SimCounters


@dataclass
class ControlLoops:
    readiness: ReadinessWatcher
    janitor: Janitor
    degradation: DegradationMonitor
    actions: Counter[str] = field(default_factory=Counter)

    def spawn(self, supervisor: Supervisor) -> None:
        supervisor.spawn("readiness", self.readiness.run())
        supervisor.spawn("janitor", self.janitor.run())
        supervisor.spawn("degradation", self.degradation.run())


def build_control(
    settings: Settings,
    node: NodeService,
    *,
    ports: Ports,
    events: EventLog,
    gate: ProfileGate,
    sampler: Sampler,
    clock: Callable[[], float],
) -> ControlLoops:
    actions: Counter[str] = Counter()
    r, j, d = settings.readiness, settings.janitor, settings.degradation
    attributor = ProcessAttributor(events)  # one cache, each mismatch reported once
    readiness = ReadinessWatcher(
        node,
        gpu=ports.gpu,
        mps_states=ports.mps.states,
        events=events,
        clock=clock,
        policy=r.policy,
        interval_s=r.interval_s,
        attributor=attributor,
    )
    janitor = Janitor(
        node,
        mps=ports.mps,
        gpu=ports.gpu,
        events=events,
        clock=clock,
        policy=Policy(
            j.unknown_clients, j.exit_grace_s, j.memory_policy, settings.dra.memory_policy
        ),
        interval_s=j.interval_s,
        actions=actions,
        attributor=attributor,
    )
    degradation = DegradationMonitor(
        node,
        gate=gate,
        mps=ports.mps,
        events=events,
        rule=DegradationRule(d.windows, d.margin, d.cooldown_windows, d.evict),
        clock=clock,
        stale_after_s=settings.telemetry.stale_after_s,
        actions=actions,
    )
    sampler.listeners.append(degradation.on_window)
    return ControlLoops(readiness, janitor, degradation, actions)


def connect_sim_counters(
    telemetry: TelemetrySource | None, node: NodeService, gate: ProfileGate
) -> None:
    """On the simulated node, device counters follow the leases placed there."""
    counters = getattr(telemetry, "counters", None)
    if isinstance(counters, SimCounters):
        counters.signature = gate.lease_counters
        counters.leases = lambda uuid: [x for x in node.leases.values() if x.device_uuid == uuid]
