"""The control loops after admission: readiness (leases whose client never came), the
janitor (stale and unknown MPS clients, memory over the limit) and degradation (devices
under their retention floor)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config.fields import setting


@dataclass(frozen=True, slots=True)
class ReadinessSettings:
    deadline_s: float = setting(
        600.0, "Seconds an admitted lease has for a client to appear on its device.", min=0.1
    )
    policy: str = setting(
        "report",
        "What happens to a lease still not ready at its deadline: 'report' (an event, the "
        "lease stays) or 'reclaim' (the lease becomes ineffective; its capacity is freed).",
        choices=("report", "reclaim"),
    )
    interval_s: float = setting(2.0, "Seconds between two readiness checks.", min=0.05)
    model_dir: str = setting(
        "default",
        "Readiness predictor for AdmitBatch ordering (from `gpushare readiness train`). "
        "'default': the model shipped with the agent (synthetic training data); 'none': "
        "arrival order.",
    )


@dataclass(frozen=True, slots=True)
class JanitorSettings:
    interval_s: float = setting(10.0, "Seconds between two janitor passes.", min=0.05)
    unknown_clients: str = setting(
        "report",
        "MPS clients that belong to no lease: 'report' (an event once) or 'terminate' "
        "(terminate_client).",
        choices=("report", "terminate"),
    )
    exit_grace_s: float = setting(
        60.0,
        "Seconds after a ready lease's last process exited before the lease is released.",
        min=0.0,
    )
    memory_policy: str = setting(
        "report",
        "A lease whose processes use more device memory than its limit: 'report' (a "
        "violation event and metric) or 'enforce' (its clients are terminated too: only "
        "those its cgroup says are its own, see mps.md).",
        choices=("report", "enforce"),
    )


@dataclass(frozen=True, slots=True)
class DegradationSettings:
    windows: int = setting(
        3, "w: consecutive windows under floor that degrade a device (and above, recover).", min=1
    )
    margin: float = setting(
        0.05, "Hysteresis: recovery needs every protected lease at floor + margin.", min=0.0
    )
    cooldown_windows: int = setting(
        3, "Windows to wait after an eviction before the next one.", min=0
    )
    evict: bool = setting(
        True, "Evict the youngest best-effort lease of a degraded device (never guaranteed)."
    )
