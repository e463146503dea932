"""Leases and their state machine.

    reserved ──► admitted ──► ready ──► released | evicted | failed
        │            │
        │            ├──► ineffective   (never ready by its deadline)
        │            └──► released | evicted | failed
        └──► expired | released         (TTL passed, or aborted)

Terminal states have no way out. Every allowed transition is listed in
:data:`ALLOWED_TRANSITIONS`; :func:`transition` is the only way to change a lease's state.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.core.errors import LeaseTransitionError
from agent.core.types import PriorityClass


class LeaseState(enum.StrEnum):
    RESERVED = "reserved"
    ADMITTED = "admitted"
    READY = "ready"
    RELEASED = "released"
    EXPIRED = "expired"
    EVICTED = "evicted"
    FAILED = "failed"
    INEFFECTIVE = "ineffective"

    @property
    def is_terminal(self) -> bool:
        return not ALLOWED_TRANSITIONS[self]

    @property
    def holds_capacity(self) -> bool:
        """Reserved, admitted and ready leases hold memory and threads on their device."""
        return self in (LeaseState.RESERVED, LeaseState.ADMITTED, LeaseState.READY)


CLAIM_OWNER = "dra"  # the owner of the DRA driver's leases (see Lease.held_by_claim)
CLAIM_REQUEST_PREFIX = "dra:"  # its request ids, kept from other callers
LEASE_ID_PATTERN = r"l-[A-Za-z0-9_-]{16}"  # "l-" and 12 random bytes, URL-safe base64


# How the agent ends its refusal of a request id whose lease has ended (FAILED_PRECONDITION).
ENDED_REQUEST_ID_HINT = "use a new request id"


def new_lease_id() -> str:
    """A fresh lease id (unguessable: a lease id is what Release names)."""
    return "l-" + secrets.token_urlsafe(12)


_S = LeaseState
ALLOWED_TRANSITIONS: dict[LeaseState, frozenset[LeaseState]] = {
    _S.RESERVED: frozenset({_S.ADMITTED, _S.EXPIRED, _S.RELEASED}),
    _S.ADMITTED: frozenset({_S.READY, _S.INEFFECTIVE, _S.RELEASED, _S.EVICTED, _S.FAILED}),
    _S.READY: frozenset({_S.RELEASED, _S.EVICTED, _S.FAILED}),
    _S.RELEASED: frozenset(),
    _S.EXPIRED: frozenset(),
    _S.EVICTED: frozenset(),
    _S.FAILED: frozenset(),
    _S.INEFFECTIVE: frozenset(),
}


@dataclass(frozen=True, slots=True)
class Lease:
    """One admitted claim on a device, with the limits its clients run under."""

    lease_id: str
    request_id: str
    tenant: str
    trust_domain: str
    device_uuid: str
    priority: PriorityClass
    memory_bytes: int
    thread_pct: float
    state: LeaseState
    created_at: float
    updated_at: float
    profile: str | None = None
    retention_floor: float | None = None
    ready_deadline_at: float | None = None
    expires_at: float | None = None
    client_pids: tuple[int, ...] = ()
    reason: str = ""
    gang_id: str | None = None
    counters: Mapping[str, float] = field(default_factory=dict)  # solo counters, inline
    # The nine admission-time attributes of the readiness predictor (see HISTORY_ATTRIBUTES).
    attributes: Mapping[str, float | str] = field(default_factory=dict)
    ready_at: float | None = None  # when a client of it first appeared on its device
    # Compare-and-set: every change of a lease makes a new version; a change computed from
    # an older version is refused (see agent.node.ledger).
    version: int = 1
    owner: str = ""  # the caller identity that made it; "" for leases made before owners
    workload: str = ""  # the workload its processes must belong to (see AdmissionRequest)
    pod: str = ""  # the Kubernetes pod it is for, "<namespace>/<name>"; "" for none
    run_as_uid: int | None = None  # its processes' UID; None: not said (or made before UIDs)

    @property
    def held_by_claim(self) -> bool:
        """A share of a DRA claim: it ends when the kubelet unprepares its claim (or the
        claim is gone), never by the agent's own loops (preemption, eviction, the
        janitor's release, readiness reclaim), which would leave its pod running with a
        claim the scheduler still counts and a lease the ledger does not."""
        return self.owner == CLAIM_OWNER


def can_transition(current: LeaseState, target: LeaseState) -> bool:
    return target in ALLOWED_TRANSITIONS[current]


def transition(lease: Lease, target: LeaseState, *, at: float, reason: str = "") -> Lease:
    """Return the lease in ``target`` state, or raise if the state machine forbids it."""
    if not can_transition(lease.state, target):
        raise LeaseTransitionError(
            f"lease {lease.lease_id}: {lease.state.value} -> {target.value} is not allowed"
        )
    ready_at = at if target is LeaseState.READY else lease.ready_at
    return dataclasses.replace(
        lease,
        state=target,
        updated_at=at,
        reason=reason,
        ready_at=ready_at,
        version=lease.version + 1,
    )


HISTORY_ATTRIBUTES = (
    "accelerator_model",
    "priority",
    "job_type",
    "model_type",
    "generative",
    "requested_gpus",
    "declared_duration_s",
    "scheduling_delay_s",
    "concurrent_requests",
)
