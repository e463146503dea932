"""What a device gives leases, how a device is chosen, and how long ended leases, their
request ids and events are kept."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config.fields import setting


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    memory_reserve: str = setting(
        "1GiB", "Device memory never given to leases (driver, fragmentation head-room)."
    )
    context_overhead: str = setting(
        "512MiB", "Device memory counted for each client's CUDA context, on top of its limit."
    )
    thread_budget_pct: float = setting(
        200.0,
        "Sum of the thread percentages of a device's leases may reach this (they are caps, "
        "not reservations).",
        min=1.0,
    )
    guaranteed_budget_pct: float = setting(
        100.0, "Sum of the thread percentages of guaranteed leases on a device.", min=1.0
    )
    max_clients: int = setting(
        48, "Leases per device (the MPS client limit of Volta and later).", min=1
    )
    placement: str = setting(
        "best-fit",
        "How a device is chosen among those that fit.",
        choices=("best-fit", "first-fit", "worst-fit"),
    )
    reservation_ttl_s: float = setting(
        30.0, "Default life of a Reserve that is not committed.", min=0.1
    )
    standard_sizes: str = setting(
        "10GiB/12.5,20GiB/25,40GiB/50",
        "Request sizes (memory/threads %) that stranded capacity is measured against.",
    )
    ended_retention_s: float = setting(
        7 * 86400.0,
        "How long an ended lease and its request id are kept: a retry within it gets the "
        "same answer ('released', 'expired'); after it the id may be used again.",
        min=60.0,
    )
    event_retention_s: float = setting(
        7 * 86400.0, "How long events are kept for WatchEvents catch-up.", min=60.0
    )
    max_events: int = setting(
        100_000, "Events kept at most for catch-up (the oldest go first).", min=1000
    )
