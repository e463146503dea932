"""The admission rules (DESIGN section 3), as pure functions of values.

Memory is a space: on a device, the memory limits of the live leases, plus a context
overhead per client, plus a reserve, never exceed the device's memory. Compute is a rate:
thread percentages are caps whose sum may exceed 100 up to ``thread_budget_pct``, and
``guaranteed`` leases together stay within the stricter ``guaranteed_budget_pct``. A shared
device holds leases of one trust domain at a time; an ``exclusive`` device holds one lease.
With ``one_user_per_device`` (legacy MPS: one server per UID), a request that states its
``run_as_uid`` is refused USER_CONFLICT on an MPS device whose live leases include one of
another known UID; leases and requests without a UID are not checked (see
:mod:`agent.admission.tenancy`). Every refusal has a reason code and a sentence, and every
decision lists each device tried.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.admission.tenancy import domains_of, trust_refusal, user_refusal, users_of
from agent.core.lease import Lease, LeaseState
from agent.core.types import (
    AdmissionRequest,
    Decision,
    Device,
    DeviceAttempt,
    PriorityClass,
    ReasonCode,
    RetentionVerdict,
    SharingMode,
)
from agent.core.units import format_bytes


class Placement(enum.StrEnum):
    BEST_FIT = "best-fit"
    FIRST_FIT = "first-fit"
    WORST_FIT = "worst-fit"


@dataclass(frozen=True, slots=True)
class Rules:
    reserve_bytes: int = 1024**3
    context_overhead_bytes: int = 512 * 1024**2
    thread_budget_pct: float = 200.0
    guaranteed_budget_pct: float = 100.0
    max_clients: int = 48
    placement: Placement = Placement.BEST_FIT
    one_user_per_device: bool = True  # legacy MPS: one server per UID (off in multi-user mode)


class RetentionGate(Protocol):
    """Predicts the retention of a request and of each lease on a device if it joined."""

    @property
    def name(self) -> str:
        """What answers (a model, or the fallback rule), as the decisions name it."""
        ...

    def __call__(self, view: DeviceView, request: AdmissionRequest) -> RetentionVerdict: ...

    def explaining(self) -> RetentionGate:
        """The same gate for Explain: it shows every prediction, even where nothing could
        be refused."""
        ...


@dataclass(frozen=True, slots=True)
class Tally:
    """What the leases on a device commit, kept incrementally by the ledger."""

    memory_bytes: int = 0
    thread_pct: float = 0.0
    guaranteed_thread_pct: float = 0.0
    clients: int = 0

    def plus(self, lease: Lease, sign: int = 1) -> Tally:
        guaranteed = lease.thread_pct if lease.priority is PriorityClass.GUARANTEED else 0.0
        return Tally(
            self.memory_bytes + sign * lease.memory_bytes,
            round(self.thread_pct + sign * lease.thread_pct, 9),
            round(self.guaranteed_thread_pct + sign * guaranteed, 9),
            self.clients + sign,
        )

    def minus(self, lease: Lease) -> Tally:
        return self.plus(lease, -1)

    @staticmethod
    def of(leases: Sequence[Lease]) -> Tally:
        tally = Tally()
        for lease in leases:
            tally = tally.plus(lease)
        return tally


@dataclass(frozen=True, slots=True)
class DeviceView:
    """A device and what holds capacity on it; ``closed`` says why it takes nothing now.

    ``tally`` is the ledger's running sum over ``leases`` (computed here when absent);
    ``pinned`` are leases whose own write is in flight: never picked as victims."""

    device: Device
    leases: tuple[Lease, ...] = ()
    closed: ReasonCode | None = None
    closed_detail: str = ""
    tally: Tally | None = None
    pinned: frozenset[str] = frozenset()
    domains: frozenset[str] | None = None  # the leases' trust domains (the ledger keeps them)
    users: frozenset[int] | None = None  # the leases' known UIDs (the ledger keeps them)

    def totals(self) -> Tally:
        return self.tally if self.tally is not None else Tally.of(self.leases)

    @property
    def memory_committed_bytes(self) -> int:
        return self.totals().memory_bytes

    @property
    def threads_committed_pct(self) -> float:
        return self.totals().thread_pct


def memory_left_bytes(view: DeviceView, rules: Rules, *, extra_clients: int = 0) -> int:
    """Memory still free for a lease limit if ``extra_clients`` more clients join."""
    clients = len(view.leases) + extra_clients
    used = view.memory_committed_bytes + clients * rules.context_overhead_bytes
    return view.device.memory_bytes - rules.reserve_bytes - used


def check(
    view: DeviceView, request: AdmissionRequest, rules: Rules, gate: RetentionGate | None = None
) -> DeviceAttempt:
    """Does ``request`` fit on this device as it is? The first rule that fails says why;
    the retention gate, if any, speaks last (only on occupied devices)."""
    refusal = _refusal(view, request, rules)
    if refusal is not None:
        reason, detail = refusal
        return DeviceAttempt(view.device.uuid, fits=False, reason=reason, detail=detail)
    return _gated(view, request, gate)


def _gated(
    view: DeviceView, request: AdmissionRequest, gate: RetentionGate | None
) -> DeviceAttempt:
    """The retention gate's word on a device whose rules already pass."""
    if gate is None or not view.leases:
        return DeviceAttempt(view.device.uuid, fits=True)
    verdict = gate(view, request)
    if verdict.ok:
        return DeviceAttempt(view.device.uuid, fits=True, predictions=verdict.predictions)
    return DeviceAttempt(
        view.device.uuid,
        fits=False,
        reason=ReasonCode.RETENTION_BELOW_FLOOR,
        detail=verdict.detail,
        predictions=verdict.predictions,
    )


def _refusal(
    view: DeviceView, request: AdmissionRequest, rules: Rules
) -> tuple[ReasonCode, str] | None:
    device = view.device
    if view.closed is not None:
        return view.closed, view.closed_detail or f"device is closed ({view.closed.value})"
    if request.gpu_model and request.gpu_model.lower() not in device.model.lower():
        return ReasonCode.MODEL_MISMATCH, f"wants {request.gpu_model}, device is {device.model}"
    if device.sharing_mode is SharingMode.EXCLUSIVE and view.leases:
        return ReasonCode.EXCLUSIVE_BUSY, "exclusive device already holds a lease"
    shared = trust_refusal(domains_of(view.leases, view.domains), request) or user_refusal(
        users_of(view.leases, view.users),
        request,
        device,
        one_user_per_device=rules.one_user_per_device,
    )
    if shared is not None:
        return shared
    if len(view.leases) + 1 > rules.max_clients:
        return ReasonCode.CLIENT_LIMIT, f"device already has {len(view.leases)} clients"
    left = memory_left_bytes(view, rules, extra_clients=1)
    if request.memory_bytes > left:
        return ReasonCode.NO_MEMORY, (
            f"needs {format_bytes(request.memory_bytes)}, "
            f"{format_bytes(max(left, 0))} left after reserve and context overhead"
        )
    threads = view.threads_committed_pct + request.thread_pct
    if threads > rules.thread_budget_pct + 1e-9:
        return ReasonCode.NO_COMPUTE, (
            f"threads would reach {threads:g}% of a {rules.thread_budget_pct:g}% budget"
        )
    if request.priority is PriorityClass.GUARANTEED:
        guaranteed = request.thread_pct + view.totals().guaranteed_thread_pct
        if guaranteed > rules.guaranteed_budget_pct + 1e-9:
            return ReasonCode.NO_COMPUTE, (
                f"guaranteed threads would reach {guaranteed:g}% of "
                f"{rules.guaranteed_budget_pct:g}%"
            )
    return None


def _fit_key(view: DeviceView, request: AdmissionRequest, rules: Rules) -> tuple[float, ...]:
    memory_after = memory_left_bytes(view, rules, extra_clients=1) - request.memory_bytes
    threads_after = rules.thread_budget_pct - view.threads_committed_pct - request.thread_pct
    if rules.placement is Placement.FIRST_FIT:
        return (view.device.index,)
    if rules.placement is Placement.WORST_FIT:
        return (-memory_after, -threads_after, view.device.index)
    return (memory_after, threads_after, view.device.index)


def decide(
    request: AdmissionRequest,
    views: Sequence[DeviceView],
    rules: Rules,
    *,
    now: float,
    allow_preemption: bool = True,
    gate: RetentionGate | None = None,
) -> Decision:
    """Admit onto the best device by the placement rule, preempt if allowed, or refuse. A
    request pinned to a device (``device_uuid``) is decided on that device alone."""
    if request.device_uuid is not None:
        views = [v for v in views if v.device.uuid == request.device_uuid]
        if not views:
            return Decision(
                False,
                reason=ReasonCode.DEVICE_UNAVAILABLE,
                message=f"device {request.device_uuid} is not on this node",
            )
    attempts = _attempts_in_fit_order(request, views, rules, gate)
    fitting = [(v, a) for v, a in zip(views, attempts, strict=True) if a.fits and a.checked]
    estimator = gate.name if gate is not None else ""
    if fitting:
        chosen, attempt = min(fitting, key=lambda pair: _fit_key(pair[0], request, rules))
        return Decision(
            True,
            chosen.device.uuid,
            attempts=attempts,
            message=f"placed by {rules.placement.value}",
            predictions=attempt.predictions,
            estimator=estimator,
        )
    # a pinned request (a DRA share) was placed by capacity, not to evict: it never preempts
    preempting = allow_preemption and request.device_uuid is None
    if preempting and request.priority is PriorityClass.GUARANTEED:
        plan = preemption_plan(request, views, rules, now=now, gate=gate)
        if plan is not None:
            return plan.decision(attempts)
    return refusal(attempts)


def _attempts_in_fit_order(
    request: AdmissionRequest,
    views: Sequence[DeviceView],
    rules: Rules,
    gate: RetentionGate | None,
) -> tuple[DeviceAttempt, ...]:
    """Every device's attempt, in the views' order. The retention gate (the costly check)
    runs on the devices that pass the rules in placement order and stops at the first it
    accepts: the devices after it are marked as passing the rules, not gated."""
    attempts: dict[int, DeviceAttempt] = {}
    passing: list[int] = []
    for at, view in enumerate(views):
        refused = _refusal(view, request, rules)
        if refused is None:
            passing.append(at)
            attempts[at] = DeviceAttempt(view.device.uuid, fits=True)
        else:
            attempts[at] = DeviceAttempt(
                view.device.uuid, fits=False, reason=refused[0], detail=refused[1]
            )
    passing.sort(key=lambda at: _fit_key(views[at], request, rules))
    for position, at in enumerate(passing):
        attempt = _gated(views[at], request, gate)
        attempts[at] = attempt
        if attempt.fits:
            for later in passing[position + 1 :]:
                attempts[later] = DeviceAttempt(
                    views[later].device.uuid,
                    fits=True,
                    checked=False,
                    detail="passes the rules; a better-fitting device was chosen first",
                )
            break
    return tuple(attempts[at] for at in range(len(views)))


def refusal(attempts: Sequence[DeviceAttempt]) -> Decision:
    """The refusal whose reason is the most telling of the attempts (or no device at all)."""
    if not attempts:
        return Decision(
            False,
            reason=ReasonCode.DEVICE_UNAVAILABLE,
            message="this node has no schedulable device",
        )
    order = list(ReasonCode)
    best = min(attempts, key=lambda a: _reason_rank(a.reason, order))
    assert best.reason is not None
    return Decision(
        False,
        reason=best.reason,
        attempts=tuple(attempts),
        message=f"no device fits: {best.device_uuid}: {best.detail}",
    )


_RANK = (
    ReasonCode.NO_MEMORY,
    ReasonCode.NO_COMPUTE,
    ReasonCode.CLIENT_LIMIT,
    ReasonCode.TRUST_CONFLICT,
    ReasonCode.USER_CONFLICT,
    ReasonCode.EXCLUSIVE_BUSY,
    ReasonCode.RETENTION_BELOW_FLOOR,
    ReasonCode.DEVICE_DEGRADED,
    ReasonCode.DRAINING,
    ReasonCode.DEVICE_UNAVAILABLE,
    ReasonCode.STORE_UNAVAILABLE,
    ReasonCode.MODEL_MISMATCH,
)


def _reason_rank(reason: ReasonCode | None, order: list[ReasonCode]) -> int:
    """Capacity reasons first: they say the most about what would help."""
    if reason in _RANK:
        return _RANK.index(reason)
    return len(_RANK) + (order.index(reason) if reason in order else 0)


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    device_uuid: str
    victims: tuple[Lease, ...]
    lost_lease_s: float

    def decision(self, attempts: Sequence[DeviceAttempt]) -> Decision:
        ids = tuple(v.lease_id for v in self.victims)
        return Decision(
            True,
            self.device_uuid,
            attempts=tuple(attempts),
            preempted_lease_ids=ids,
            preempted_lease_s=self.lost_lease_s,
            message=(
                f"preempts {len(ids)} best-effort lease(s), "
                f"{self.lost_lease_s:.0f} s of lease time lost"
            ),
        )


def preemption_plan(
    request: AdmissionRequest,
    views: Sequence[DeviceView],
    rules: Rules,
    *,
    now: float,
    gate: RetentionGate | None = None,
) -> PreemptionPlan | None:
    """For a guaranteed request: the device where evicting the fewest, youngest best-effort
    leases makes it fit, losing the least lease time."""
    plans = []
    for view in views:
        if view.closed is not None:
            continue
        victims = sorted(
            (
                lease
                for lease in view.leases
                if lease.priority is PriorityClass.BEST_EFFORT
                and lease.state in (LeaseState.ADMITTED, LeaseState.READY)
                and lease.lease_id not in view.pinned
                and not lease.held_by_claim
            ),
            key=lambda lease: -lease.created_at,
        )
        for count in range(1, len(victims) + 1):
            chosen = victims[:count]
            remaining = tuple(lease for lease in view.leases if lease not in chosen)
            trial = DeviceView(view.device, remaining)
            if check(trial, request, rules, gate).fits:
                lost = sum(max(0.0, now - lease.created_at) for lease in chosen)
                plans.append(PreemptionPlan(view.device.uuid, tuple(chosen), lost))
                break
    if not plans:
        return None
    return min(plans, key=lambda p: (len(p.victims), p.lost_lease_s, p.device_uuid))
