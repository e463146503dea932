"""The control loops that keep a shared node healthy after admission, built from settings:
readiness, the janitor and the degradation monitor. The App starts them once the ledger is
loaded; each is a supervised task, and all count their actions in one place."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.admission.degradation import DegradationRule
from agent.aio.tasks import Supervisor
from agent.config import Settings
from agent.control.attribution import ProcessAttributor
from agent.control.degrade import DegradationMonitor, LiveGate
from agent.control.janitor import Janitor
from agent.control.readiness import ReadinessWatcher
from agent.gpu.port import GpuBackend
from agent.gpu.sampler import Sampler
from agent.mps.port import MpsManager
from agent.mps.stale import Policy
from agent.node.events import EventLog
from agent.node.service import NodeService


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
    gpu: GpuBackend,
    mps: MpsManager,
    events: EventLog,
    gate: LiveGate,
    sampler: Sampler,
    clock: Callable[[], float],
) -> ControlLoops:
    actions: Counter[str] = Counter()
    r, j, d = settings.readiness, settings.janitor, settings.degradation
    attributor = ProcessAttributor(events)  # one cache, each mismatch reported once
    readiness = ReadinessWatcher(
        node,
        gpu=gpu,
        mps_states=mps.states,
        events=events,
        clock=clock,
        policy=r.policy,
        interval_s=r.interval_s,
        attributor=attributor,
    )
    janitor = Janitor(
        node,
        mps=mps,
        gpu=gpu,
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
        mps=mps,
        events=events,
        rule=DegradationRule(d.windows, d.margin, d.cooldown_windows, d.evict),
        clock=clock,
        stale_after_s=settings.telemetry.stale_after_s,
        actions=actions,
    )
    sampler.listeners.append(degradation.on_window)
    return ControlLoops(readiness, janitor, degradation, actions)
