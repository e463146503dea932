"""The w-window degradation rule (DESIGN section 3). Pure: state in, state and actions out.

For each protected lease (one with a retention floor) the rule keeps its last ``w`` window
estimates. The device becomes *degraded* when some protected lease was under its floor in
all of the last ``w`` consecutive windows; it recovers when every protected lease has been
at or above floor + ``margin`` for ``w`` consecutive windows. While degraded the device is
closed to new admissions and, if ``evict`` allows, the lowest-priority, youngest
best-effort lease is evicted; then the rule waits ``cooldown`` windows and evicts again
only if the device is still degraded. ``guaranteed`` leases are never evicted. A window
with stale telemetry changes nothing (it neither counts towards degrading nor recovering).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.core.lease import Lease, LeaseState
from agent.core.types import PriorityClass


@dataclass(frozen=True, slots=True)
class DegradationRule:
    w: int = 3
    margin: float = 0.05
    cooldown_windows: int = 3
    evict: bool = True


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """What the rule remembers of one device between windows."""

    degraded: bool = False
    below: Mapping[str, int] = field(default_factory=dict)  # lease -> windows under floor
    recovered: int = 0  # consecutive windows with every protected lease >= floor + margin
    cooldown: int = 0  # windows to wait before the next eviction


@dataclass(frozen=True, slots=True)
class Step:
    health: DeviceHealth
    evict: str | None = None  # a lease id
    became_degraded: bool = False
    recovered: bool = False
    reason: str = ""


def step(
    rule: DegradationRule,
    health: DeviceHealth,
    leases: Sequence[Lease],
    estimates: Mapping[str, float] | None,
) -> Step:
    """Advance one window. ``estimates`` is None when the device's telemetry is stale."""
    if estimates is None:
        return Step(health, reason="telemetry stale: rule paused")
    protected = [x for x in leases if x.retention_floor is not None and x.lease_id in estimates]
    below = {
        x.lease_id: health.below.get(x.lease_id, 0) + 1
        for x in protected
        if estimates[x.lease_id] < (x.retention_floor or 0.0)
    }
    healthy = all(
        estimates[x.lease_id] >= (x.retention_floor or 0.0) + rule.margin for x in protected
    )
    recovered = health.recovered + 1 if healthy else 0
    waiting = health.cooldown > 0
    cooldown = max(0, health.cooldown - 1)
    worst = max(below.items(), key=lambda item: item[1], default=None)
    degrade = worst is not None and worst[1] >= rule.w
    if health.degraded and recovered >= rule.w:
        return Step(
            DeviceHealth(False, below, recovered, 0),
            recovered=True,
            reason=f"every protected lease at or above its floor + {rule.margin:g} "
            f"for {rule.w} windows",
        )
    degraded = health.degraded or degrade
    next_health = DeviceHealth(degraded, below, recovered, cooldown)
    if not degraded:
        return Step(next_health)
    became = degraded and not health.degraded
    reason = (
        f"lease {worst[0]} under its floor for {worst[1]} windows" if worst else "still degraded"
    )
    if not rule.evict or waiting or not degrade:
        return Step(next_health, became_degraded=became, reason=reason)
    victim = eviction_candidate(leases)
    if victim is None:
        return Step(next_health, became_degraded=became, reason=f"{reason}; nothing to evict")
    return Step(
        replace(next_health, cooldown=rule.cooldown_windows),
        evict=victim.lease_id,
        became_degraded=became,
        reason=f"{reason}; evicting {victim.lease_id}",
    )


def eviction_candidate(leases: Sequence[Lease]) -> Lease | None:
    """The lowest-priority, youngest best-effort lease that holds the device (never
    guaranteed, never burstable, never a DRA claim's share: it ends with its claim)."""
    candidates = [
        x
        for x in leases
        if x.priority is PriorityClass.BEST_EFFORT
        and x.state in (LeaseState.ADMITTED, LeaseState.READY)
        and not x.held_by_claim
    ]
    return max(candidates, key=lambda x: x.created_at, default=None)
