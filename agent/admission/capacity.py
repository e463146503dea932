"""Stranded capacity and batch placement. Pure.

Stranded capacity is free memory and threads that no standard request size can use: a
device whose free space cannot take even the smallest standard request strands all of it.
Batch placement places many candidates in a given order with the placement rule, each
decision seeing the ones before it: O(n x devices), with devices per node a small constant.
A batch never preempts: a guaranteed request that needs to goes through ``Admit`` alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from agent.admission.policy import DeviceView, Rules, check, decide, memory_left_bytes
from agent.core.lease import Lease, LeaseState
from agent.core.types import AdmissionRequest, Decision, PriorityClass


@dataclass(frozen=True, slots=True)
class StandardSize:
    memory_bytes: int
    thread_pct: float


@dataclass(frozen=True, slots=True)
class Stranded:
    memory_bytes: int
    thread_pct: float
    devices: tuple[str, ...]


def stranded(views: Sequence[DeviceView], rules: Rules, sizes: Sequence[StandardSize]) -> Stranded:
    memory, threads, devices = 0, 0.0, []
    for view in views:
        if view.closed is not None:
            continue
        free_memory = max(0, memory_left_bytes(view, rules))
        free_threads = max(0.0, rules.thread_budget_pct - view.threads_committed_pct)
        if free_memory <= 0 and free_threads <= 0:
            continue
        domain = view.leases[0].trust_domain if view.leases else "any"
        usable = any(check(view, _probe(size, domain), rules).fits for size in sizes)
        if not usable:
            memory += free_memory
            threads += free_threads
            devices.append(view.device.uuid)
    return Stranded(memory, threads, tuple(devices))


def _probe(size: StandardSize, domain: str) -> AdmissionRequest:
    return AdmissionRequest(
        "probe", "probe", domain, PriorityClass.BEST_EFFORT, size.memory_bytes, size.thread_pct
    )


def place_batch(
    requests: Sequence[AdmissionRequest],
    views: Sequence[DeviceView],
    rules: Rules,
    *,
    now: float,
) -> list[Decision]:
    """Decide each request in order; admitted ones hold capacity for those after them."""
    current = {v.device.uuid: v for v in views}
    decisions = []
    for request in requests:
        decision = decide(request, list(current.values()), rules, now=now, allow_preemption=False)
        if decision.admitted:
            assert decision.device_uuid is not None
            view = current[decision.device_uuid]
            pending = pending_lease(request, view.device.uuid, now)
            current[view.device.uuid] = with_pending(view, pending)
        decisions.append(decision)
    return decisions


def with_pending(view: DeviceView, pending: Lease) -> DeviceView:
    """``view`` with ``pending`` counted: its capacity, its trust domain and its UID (where
    the view carries the ledger's counts), as later decisions must see them."""
    domains = None if view.domains is None else view.domains | {pending.trust_domain}
    users = view.users
    if users is not None and pending.run_as_uid is not None:
        users = users | {pending.run_as_uid}
    return dataclasses.replace(
        view,
        leases=(*view.leases, pending),
        tally=view.totals().plus(pending),
        domains=domains,
        users=users,
    )


def pending_lease(
    request: AdmissionRequest,
    device_uuid: str,
    now: float,
    *,
    lease_id: str = "",
    state: LeaseState = LeaseState.ADMITTED,
) -> Lease:
    """``request`` as a lease on ``device_uuid`` that is not granted yet: counted against
    the device by later decisions (a batch's earlier placements, an assumed bind)."""
    return Lease(
        lease_id=lease_id or f"batch:{request.request_id}",
        request_id=request.request_id,
        tenant=request.tenant,
        trust_domain=request.trust_domain,
        device_uuid=device_uuid,
        priority=request.priority,
        memory_bytes=request.memory_bytes,
        thread_pct=request.thread_pct,
        state=state,
        created_at=now,
        updated_at=now,
        run_as_uid=request.run_as_uid,
    )
