"""The one-user rule (legacy MPS runs one server per UID), table by table: a request that
states its UID joins a device of the same UID or of none, is refused USER_CONFLICT where
another known UID runs, and is not checked when it does not say."""

from __future__ import annotations

import dataclasses

import pytest

from agent.admission.capacity import pending_lease, place_batch
from agent.admission.policy import DeviceView, Rules, check, decide
from agent.config import load_settings
from agent.core.lease import Lease, LeaseState
from agent.core.types import AdmissionRequest, Device, PriorityClass, ReasonCode, SharingMode
from agent.core.units import GIB
from agent.runtime.wiring import admission_rules

G, B, BE = PriorityClass.GUARANTEED, PriorityClass.BURSTABLE, PriorityClass.BEST_EFFORT
RULES = Rules(reserve_bytes=0, context_overhead_bytes=0, max_clients=8)
OFF = dataclasses.replace(RULES, one_user_per_device=False)
MPS, EXCLUSIVE = SharingMode.MPS, SharingMode.EXCLUSIVE


def device(index: int = 0, mode: SharingMode = MPS) -> Device:
    return Device(f"GPU-{index}", index, "H100", 80 * GIB, sharing_mode=mode)


def lease(
    uid: int | None,
    *,
    lease_id: str = "l",
    priority: PriorityClass = B,
    domain: str = "a",
    memory_gib: float = 10,
    state: LeaseState = LeaseState.ADMITTED,
    dev: str = "GPU-0",
) -> Lease:
    return Lease(
        lease_id,
        f"r-{lease_id}",
        "t",
        domain,
        dev,
        priority,
        int(memory_gib * GIB),
        10.0,
        state,
        0.0,
        0.0,
        run_as_uid=uid,
    )


def request(
    uid: int | None,
    *,
    memory_gib: float = 10,
    priority: PriorityClass = B,
    domain: str = "a",
    request_id: str = "req",
) -> AdmissionRequest:
    return AdmissionRequest(
        request_id, "t", domain, priority, int(memory_gib * GIB), 10.0, run_as_uid=uid
    )


CASES = [
    # (why, device mode, rules, UIDs of the leases on the device, request's UID, reason)
    ("an empty device takes any UID", MPS, RULES, [], 1000, None),
    ("the same UID joins", MPS, RULES, [1000, 1000], 1000, None),
    ("another UID is refused", MPS, RULES, [1000], 2000, ReasonCode.USER_CONFLICT),
    (
        "one lease of another UID is enough",
        MPS,
        RULES,
        [1000, 2000],
        2000,
        ReasonCode.USER_CONFLICT,
    ),
    ("a request that does not say is not checked", MPS, RULES, [1000], None, None),
    ("leases that did not say do not count", MPS, RULES, [None, None], 2000, None),
    ("beside them, the known UID counts", MPS, RULES, [None, 1000], 2000, ReasonCode.USER_CONFLICT),
    ("root is a UID like another", MPS, RULES, [0], 1000, ReasonCode.USER_CONFLICT),
    ("multi-user daemons serve several UIDs", MPS, OFF, [1000], 2000, None),
    ("an empty exclusive device takes any UID", EXCLUSIVE, RULES, [], 2000, None),
    (
        "an exclusive device holds one lease",
        EXCLUSIVE,
        RULES,
        [1000],
        2000,
        ReasonCode.EXCLUSIVE_BUSY,
    ),
]


@pytest.mark.parametrize(("why", "mode", "rules", "uids", "uid", "reason"), CASES)
def test_the_rule(
    why: str,
    mode: SharingMode,
    rules: Rules,
    uids: list[int | None],
    uid: int | None,
    reason: ReasonCode | None,
) -> None:
    leases = tuple(lease(u, lease_id=f"l{i}") for i, u in enumerate(uids))
    attempt = check(DeviceView(device(mode=mode), leases), request(uid), rules)
    assert attempt.reason is reason, f"{why}: {attempt.detail}"
    assert attempt.fits is (reason is None), why


def test_the_refusal_says_why_in_a_sentence() -> None:
    attempt = check(DeviceView(device(), (lease(1000),)), request(2000), RULES)
    assert attempt.detail == (
        "device's MPS server runs as UID 1000; a client of UID 2000 would wait in CUDA "
        "initialisation until every client of UID 1000 ends (one user per MPS control daemon)"
    )


def test_the_ledgers_count_is_what_the_rule_reads() -> None:
    """A view that carries the ledger's UIDs is decided on them (O(1)), not on its leases."""
    kept = DeviceView(device(), (lease(None),), users=frozenset({1000}))
    assert check(kept, request(2000), RULES).reason is ReasonCode.USER_CONFLICT
    none_kept = DeviceView(device(), (lease(1000),), users=frozenset())
    assert check(none_kept, request(2000), RULES).fits


def test_the_trust_domain_is_checked_first() -> None:
    view = DeviceView(device(), (lease(1000, domain="a"),))
    assert check(view, request(2000, domain="b"), RULES).reason is ReasonCode.TRUST_CONFLICT


def test_explain_lists_the_conflict_per_device_and_places_elsewhere() -> None:
    views = [
        DeviceView(device(0), (lease(1000),)),
        DeviceView(device(1), (lease(2000, dev="GPU-1", memory_gib=60),)),
    ]
    decision = decide(request(2000), views, RULES, now=0.0)
    assert decision.admitted and decision.device_uuid == "GPU-1"
    first = decision.attempts[0]
    assert (first.reason, first.fits) == (ReasonCode.USER_CONFLICT, False)
    assert "UID 1000" in first.detail
    refused = decide(request(3000), views, RULES, now=0.0)
    assert not refused.admitted and refused.reason is ReasonCode.USER_CONFLICT
    assert [a.reason for a in refused.attempts] == [ReasonCode.USER_CONFLICT] * 2
    assert "one user per MPS control daemon" in refused.message


@pytest.mark.parametrize("kept", [True, False], ids=["ledger-counts", "summed"])
def test_a_batchs_earlier_placement_holds_its_uid(kept: bool) -> None:
    view = DeviceView(device(), users=frozenset() if kept else None)
    batch = [request(1000, request_id="a"), request(2000, request_id="b")]
    first, second = place_batch(batch, [view], RULES, now=0.0)
    assert first.admitted
    assert not second.admitted and second.reason is ReasonCode.USER_CONFLICT
    unsaid = place_batch([request(1000, request_id="a"), request(None)], [view], RULES, now=0.0)
    assert all(d.admitted for d in unsaid)


def test_a_pending_gang_reservation_holds_its_uid() -> None:
    reserved = pending_lease(request(1000), "GPU-0", 0.0, state=LeaseState.RESERVED)
    assert reserved.run_as_uid == 1000
    view = DeviceView(device(), (reserved,))
    assert check(view, request(2000), RULES).reason is ReasonCode.USER_CONFLICT
    assert check(view, request(1000), RULES).fits


def test_preemption_frees_a_device_of_another_uid_only_when_none_of_it_is_left() -> None:
    """As with trust domains: evicting best-effort leases of another UID makes room only
    if no lease of that UID stays on the device."""
    best_effort = DeviceView(device(), (lease(1000, priority=BE),))
    decision = decide(request(2000, priority=G), [best_effort], RULES, now=10.0)
    assert decision.admitted and decision.preempted_lease_ids == ("l",)
    kept = (lease(1000, priority=BE, lease_id="be"), lease(1000, lease_id="burstable"))
    refused = decide(request(2000, priority=G), [DeviceView(device(), kept)], RULES, now=10.0)
    assert not refused.admitted and refused.reason is ReasonCode.USER_CONFLICT


@pytest.mark.parametrize(("multi_user", "one_user"), [(False, True), (True, False)])
def test_the_rule_is_wired_from_the_mps_mode(multi_user: bool, one_user: bool) -> None:
    settings = load_settings(overrides={"mps.multi_user": multi_user})
    assert admission_rules(settings).one_user_per_device is one_user
