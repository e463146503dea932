"""The admission rules, table by table."""

from __future__ import annotations

import dataclasses

import pytest

from agent.admission.capacity import StandardSize, place_batch, stranded
from agent.admission.policy import DeviceView, Placement, Rules, check, decide
from agent.core.lease import CLAIM_OWNER, Lease, LeaseState
from agent.core.types import (
    AdmissionRequest,
    Device,
    PriorityClass,
    ReasonCode,
    RetentionVerdict,
    SharingMode,
)
from agent.core.units import GIB

G, B, BE = PriorityClass.GUARANTEED, PriorityClass.BURSTABLE, PriorityClass.BEST_EFFORT
RULES = Rules(
    reserve_bytes=2 * GIB,
    context_overhead_bytes=GIB // 2,
    thread_budget_pct=200,
    guaranteed_budget_pct=100,
    max_clients=4,
)


def device(
    index: int = 0,
    memory_gib: int = 80,
    mode: SharingMode = SharingMode.MPS,
    model: str = "H100-SXM5-80GB",
) -> Device:
    return Device(f"GPU-{index}", index, model, memory_gib * GIB, sharing_mode=mode)


def lease(
    memory_gib: float,
    pct: float,
    *,
    priority: PriorityClass = B,
    domain: str = "a",
    created_at: float = 0.0,
    lease_id: str = "l",
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
        pct,
        LeaseState.ADMITTED,
        created_at,
        created_at,
    )


def request(
    memory_gib: float,
    pct: float = 25,
    *,
    priority: PriorityClass = B,
    domain: str = "a",
    model: str | None = None,
) -> AdmissionRequest:
    return AdmissionRequest(
        "req", "t", domain, priority, int(memory_gib * GIB), pct, gpu_model=model
    )


# 80 GiB device - 2 GiB reserve = 78 GiB; each client costs 0.5 GiB of context.
CHECK_CASES = [
    ("empty device takes a big request", [], request(77.5), None),
    ("reserve and context overhead count", [], request(77.6), ReasonCode.NO_MEMORY),
    ("limits of live leases add up", [lease(40, 10)], request(37), None),
    ("one more byte than fits", [lease(40, 10)], request(37.01), ReasonCode.NO_MEMORY),
    ("threads may oversubscribe to the budget", [lease(1, 150)], request(1, 50), None),
    ("but not beyond it", [lease(1, 150)], request(1, 51), ReasonCode.NO_COMPUTE),
    (
        "guaranteed leases have a stricter budget",
        [lease(1, 70, priority=G)],
        request(1, 31, priority=G),
        ReasonCode.NO_COMPUTE,
    ),
    (
        "best-effort threads do not count against it",
        [lease(1, 70, priority=BE)],
        request(1, 100, priority=G),
        None,
    ),
    (
        "one trust domain per shared device",
        [lease(1, 10, domain="a")],
        request(1, domain="b"),
        ReasonCode.TRUST_CONFLICT,
    ),
    ("client limit", [lease(1, 1)] * 4, request(1, 1), ReasonCode.CLIENT_LIMIT),
    ("model constraint", [], request(1, model="A100"), ReasonCode.MODEL_MISMATCH),
    ("model constraint is a case-insensitive part of the name", [], request(1, model="h100"), None),
]


@pytest.mark.parametrize(("description", "leases", "req", "reason"), CHECK_CASES)
def test_check(
    description: str, leases: list[Lease], req: AdmissionRequest, reason: ReasonCode | None
) -> None:
    attempt = check(DeviceView(device(), tuple(leases)), req, RULES)
    assert attempt.reason is reason, f"{description}: {attempt.detail}"
    assert attempt.fits is (reason is None)
    if reason is not None:
        assert attempt.detail, "every refusal has a sentence"


def test_exclusive_devices_hold_one_lease() -> None:
    exclusive = device(mode=SharingMode.EXCLUSIVE)
    assert check(DeviceView(exclusive), request(1), RULES).fits
    busy = check(DeviceView(exclusive, (lease(1, 1),)), request(1), RULES)
    assert busy.reason is ReasonCode.EXCLUSIVE_BUSY


def test_closed_devices_say_why() -> None:
    view = DeviceView(device(), closed=ReasonCode.DRAINING, closed_detail="drained by ops")
    attempt = check(view, request(1), RULES)
    assert (attempt.reason, attempt.detail) == (ReasonCode.DRAINING, "drained by ops")


def views_with_free(*free_gib: float) -> list[DeviceView]:
    """Devices whose free memory (after reserve and one more client) is ``free_gib``."""
    views = []
    for index, free in enumerate(free_gib):
        used = 78 - 0.5 - 0.5 - free  # one existing lease's limit
        views.append(DeviceView(device(index), (lease(used, 10, dev=f"GPU-{index}"),)))
    return views


@pytest.mark.parametrize(
    ("placement", "expected"),
    [(Placement.BEST_FIT, "GPU-2"), (Placement.FIRST_FIT, "GPU-0"), (Placement.WORST_FIT, "GPU-1")],
)
def test_placement(placement: Placement, expected: str) -> None:
    views = views_with_free(20, 60, 12, 8)
    rules = dataclasses.replace(RULES, placement=placement)
    decision = decide(request(10), views, rules, now=0)
    assert decision.admitted and decision.device_uuid == expected
    assert len(decision.attempts) == 4
    assert not next(a for a in decision.attempts if a.device_uuid == "GPU-3").fits


class RefusingGate:
    """A retention gate that refuses the listed devices and records what it was asked."""

    name = "test gate"

    def __init__(self, *refused: str) -> None:
        self.refused = set(refused)
        self.asked: list[str] = []

    def __call__(self, view: DeviceView, request: AdmissionRequest) -> RetentionVerdict:
        self.asked.append(view.device.uuid)
        ok = view.device.uuid not in self.refused
        return RetentionVerdict(ok, {"candidate": 1.0 if ok else 0.1}, "" if ok else "too slow")


@pytest.mark.parametrize(
    ("refused", "asked", "chosen"),
    [
        ((), ["GPU-2"], "GPU-2"),  # the best fit passes: nobody else is gated
        (("GPU-2",), ["GPU-2", "GPU-0"], "GPU-0"),  # then the next best fit
        (("GPU-2", "GPU-0", "GPU-1"), ["GPU-2", "GPU-0", "GPU-1"], None),
    ],
)
def test_the_gate_runs_in_placement_order_and_stops_at_the_first_it_accepts(
    refused: tuple[str, ...], asked: list[str], chosen: str | None
) -> None:
    gate = RefusingGate(*refused)
    decision = decide(request(10), views_with_free(20, 60, 12, 8), RULES, now=0, gate=gate)
    assert gate.asked == asked
    assert decision.device_uuid == chosen
    by_device = {a.device_uuid: a for a in decision.attempts}
    assert [a.device_uuid for a in decision.attempts] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    for uuid in ("GPU-0", "GPU-1", "GPU-2"):
        attempt = by_device[uuid]
        assert attempt.checked == (uuid in asked)
        assert attempt.fits == (uuid not in refused)
        if not attempt.checked:
            assert "better-fitting device" in attempt.detail
    if chosen is None:
        assert decision.reason is ReasonCode.NO_MEMORY  # GPU-3: the most useful reason


def test_refusal_names_the_most_useful_reason_and_lists_every_device() -> None:
    views = [
        DeviceView(device(0), closed=ReasonCode.DRAINING),
        DeviceView(device(1), (lease(70, 10, dev="GPU-1"),)),
    ]
    decision = decide(request(20), views, RULES, now=0)
    assert not decision.admitted and decision.reason is ReasonCode.NO_MEMORY
    assert [a.reason for a in decision.attempts] == [ReasonCode.DRAINING, ReasonCode.NO_MEMORY]
    assert "GPU-1" in decision.message
    empty = decide(request(1), [], RULES, now=0)
    assert empty.reason is ReasonCode.DEVICE_UNAVAILABLE


def test_guaranteed_request_preempts_youngest_best_effort_only() -> None:
    leases = (
        lease(30, 20, priority=BE, created_at=100, lease_id="old-be"),
        lease(30, 20, priority=BE, created_at=900, lease_id="young-be"),
        lease(15, 20, priority=B, created_at=50, lease_id="burstable"),
    )
    views = [DeviceView(device(0), leases)]
    decision = decide(request(25, priority=G), views, RULES, now=1000)
    assert decision.admitted and decision.preempted_lease_ids == ("young-be",)
    assert decision.preempted_lease_s == 100.0
    refused = decide(request(25, priority=B), views, RULES, now=1000)
    assert not refused.admitted, "only guaranteed requests preempt"
    too_big = decide(request(70, priority=G), views, RULES, now=1000)
    assert not too_big.admitted, "burstable leases are never preempted"


def test_preemption_prefers_the_device_losing_least() -> None:
    views = [
        DeviceView(device(0), (lease(60, 10, priority=BE, created_at=0, lease_id="a"),)),
        DeviceView(
            device(1), (lease(60, 10, priority=BE, created_at=990, lease_id="b", dev="GPU-1"),)
        ),
    ]
    decision = decide(request(30, priority=G), views, RULES, now=1000)
    assert decision.device_uuid == "GPU-1" and decision.preempted_lease_ids == ("b",)


def test_stranded_capacity() -> None:
    sizes = [StandardSize(10 * GIB, 25)]
    views = [
        DeviceView(device(0), (lease(70, 10),)),  # 7 GiB left: stranded
        DeviceView(device(1), (lease(10, 10, dev="GPU-1"),)),
    ]  # room: not stranded
    result = stranded(views, RULES, sizes)
    assert result.devices == ("GPU-0",)
    assert result.memory_bytes == int(78 * GIB - 0.5 * GIB - 70 * GIB)
    assert result.thread_pct == 190


def test_batch_sees_earlier_admissions_and_never_preempts() -> None:
    views = [DeviceView(device(0))]
    batch = [request(40), request(30), request(20), request(5, priority=G)]
    decisions = place_batch(batch, views, RULES, now=0)
    assert [d.admitted for d in decisions] == [True, True, False, True]
    assert decisions[2].reason is ReasonCode.NO_MEMORY


def test_a_lease_becomes_ready_once_and_remembers_when() -> None:
    from agent.core.lease import transition

    admitted = lease(1, 10, created_at=100.0)
    ready = transition(admitted, LeaseState.READY, at=130.0)
    released = transition(ready, LeaseState.RELEASED, at=500.0)
    assert admitted.ready_at is None and ready.ready_at == 130.0 and released.ready_at == 130.0


PIN_CASES = [
    # (why, leases on GPU-0, pinned device, admitted, device or reason)
    ("a pinned request goes to its device", [], "GPU-1", True, "GPU-1"),
    ("even when best fit would pick another", [lease(1, 1)], "GPU-1", True, "GPU-1"),
    (
        "a full pinned device refuses; others are not tried",
        [lease(77, 10)],
        "GPU-0",
        False,
        ReasonCode.NO_MEMORY,
    ),
    ("a device the node lacks", [], "GPU-9", False, ReasonCode.DEVICE_UNAVAILABLE),
]


@pytest.mark.parametrize(("why", "leases", "pinned", "admitted", "expected"), PIN_CASES)
def test_a_request_pinned_to_a_device_is_decided_there_alone(
    why: str, leases: list[Lease], pinned: str, admitted: bool, expected: object
) -> None:
    views = [DeviceView(device(0), tuple(leases)), DeviceView(device(1))]
    ask = dataclasses.replace(request(1), device_uuid=pinned)
    decision = decide(ask, views, RULES, now=0.0)
    assert decision.admitted is admitted, why
    if admitted:
        assert decision.device_uuid == expected
    else:
        assert decision.reason is expected
        assert all(a.device_uuid == pinned for a in decision.attempts)


def test_dra_shares_neither_preempt_nor_are_preempted() -> None:
    claim_share = dataclasses.replace(
        lease(70, 10, priority=BE, lease_id="claim"), owner=CLAIM_OWNER
    )
    full = [DeviceView(device(0), (claim_share,))]
    guaranteed = request(20, priority=G)
    assert not decide(guaranteed, full, RULES, now=0.0).admitted  # the share stays
    plain = dataclasses.replace(claim_share, owner="", lease_id="plain")
    beatable = [DeviceView(device(0), (plain,))]
    assert decide(guaranteed, beatable, RULES, now=0.0).preempted_lease_ids == ("plain",)
    pinned = dataclasses.replace(guaranteed, device_uuid="GPU-0")
    assert not decide(pinned, beatable, RULES, now=0.0).admitted  # pinned: no preemption
