"""The allocator stand-in, rule by rule (R1-R14 of the anatomy's allocator section): each row
fails if its rule is broken."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.dra.fixtures import (
    DRIVER,
    NODE,
    allocated_claim,
    claim,
    device,
    device_class,
    memory,
    request,
    resource_slice,
    share,
    threads,
)
from tests.kubeworld.scheduler.allocator import (
    AllocationError,
    CannotAllocate,
    InvalidClaim,
    allocate,
    allocate_claim,
)
from tests.kubeworld.scheduler.selectors import UnsupportedSelector, compile_selector

Obj = dict[str, Any]
TWO = [resource_slice([device("gpu-0"), device("gpu-1")])]
ONE = [resource_slice([device("gpu-0")])]
DEFAULTS = {"memory": "1Gi", "threads": "10"}
TAINT = {"key": "gpushare.io/drained", "value": "yes", "effect": "NoSchedule"}
# (request, device, consumedCapacity); None: a result without shareID (the device exclusive)
Expected = list[tuple[str, str, dict[str, str] | None]]


@dataclass
class Case:
    slices: list[Obj]
    claim: Obj
    expected: Expected | type[Exception]
    allocated: list[Obj] = field(default_factory=list)
    classes: list[Obj] = field(default_factory=lambda: [device_class()])


def counters(name: str) -> Obj:
    return device(
        name, consumesCounters=[{"counterSet": "sms", "counters": {"sm": {"value": "2"}}}]
    )


def counter_slice(total: str) -> list[Obj]:
    sets = [{"name": "sms", "counters": {"sm": {"value": total}}}]
    return [resource_slice([counters("gpu-0"), counters("gpu-1")], sharedCounters=sets)]


CASES: dict[str, Case] = {
    # R1: pools, generations, order
    "R1 incomplete pool skipped": Case(
        [resource_slice([device("gpu-0")], count=2)], claim(), CannotAllocate
    ),
    "R1 older generation ignored": Case(
        [
            resource_slice([device("gpu-0")], name="a", generation=1),
            resource_slice([device("gpu-1")], name="b", generation=2),
        ],
        claim(),
        [("gpu", "gpu-1", DEFAULTS)],
    ),
    "R1 slices by name": Case(
        [
            resource_slice([device("gpu-1")], name="b", count=2),
            resource_slice([device("gpu-0")], name="a", count=2),
        ],
        claim(),
        [("gpu", "gpu-0", DEFAULTS)],
    ),
    "R1 other node's slice unused": Case(
        [resource_slice([device("gpu-0")], node="node-b")], claim(), CannotAllocate
    ),
    "R1 backtracking across two requests": Case(
        TWO,
        claim(
            request("a", capacity={"memory": "60Gi"}),
            request(
                "b",
                capacity={"memory": "60Gi"},
                selectors=['device.attributes["gpushare.io"].index == 0'],
            ),
        ),
        [
            ("a", "gpu-1", {"memory": "60Gi", "threads": "10"}),
            ("b", "gpu-0", {"memory": "60Gi", "threads": "10"}),
        ],
    ),
    # R2/R3: existing allocations
    "R2 shared results add up": Case(
        TWO,
        claim(request(capacity={"memory": "2Gi"})),
        [("gpu", "gpu-1", {"memory": "2Gi", "threads": "10"})],
        [allocated_claim(share("gpu-0", memory="79Gi", threads="10"))],
    ),
    "R3 exclusive after a result without shareID": Case(
        TWO, claim(), [("gpu", "gpu-1", DEFAULTS)], [allocated_claim({"device": "gpu-0"})]
    ),
    "R2 admin access result ignored": Case(
        TWO,
        claim(),
        [("gpu", "gpu-0", DEFAULTS)],
        [allocated_claim({"device": "gpu-0", "adminAccess": True})],
    ),
    # R4: unknown capacity
    "R4 unknown capacity skips the device": Case(
        [
            resource_slice(
                [device("gpu-0"), device("gpu-1", capacity={"bandwidth": {"value": "10"}})]
            )
        ],
        claim(request(capacity={"bandwidth": "4"})),
        [("gpu", "gpu-1", {"bandwidth": "4"})],
    ),
    # R5: the consumed amount
    "R5 1.5Gi with min 1Gi step 1Gi consumes 2Gi": Case(
        ONE,
        claim(request(capacity={"memory": "1.5Gi"})),
        [("gpu", "gpu-0", {"memory": "2Gi", "threads": "10"})],
    ),
    "R5 fraction of a unit rounds up": Case(
        [
            resource_slice(
                [
                    device(
                        "gpu-0",
                        capacity={
                            "threads": {
                                "value": "100",
                                "requestPolicy": {
                                    "default": "25",
                                    "validRange": {"min": "1", "max": "100", "step": "1"},
                                },
                            }
                        },
                    )
                ]
            )
        ],
        claim(request(capacity={"threads": "2.5"})),
        [("gpu", "gpu-0", {"threads": "3"})],
    ),
    "R5 below min gives min": Case(
        ONE,
        claim(request(capacity={"memory": "100Mi"})),
        [("gpu", "gpu-0", {"memory": "1Gi", "threads": "10"})],
    ),
    "R5 no step: as requested": Case(
        [
            resource_slice(
                [
                    device(
                        "gpu-0",
                        capacity={
                            "memory": {
                                "value": "80Gi",
                                "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi"}},
                            }
                        },
                    )
                ]
            )
        ],
        claim(request(capacity={"memory": "1.5Gi"})),
        [("gpu", "gpu-0", {"memory": "1536Mi"})],
    ),
    "R5 not requested: default": Case(ONE, claim(), [("gpu", "gpu-0", DEFAULTS)]),
    "R5 no default: the full value": Case(
        [
            resource_slice(
                [device("gpu-0", capacity={"memory": memory(), "clients": {"value": "16"}})]
            )
        ],
        claim(),
        [("gpu", "gpu-0", {"memory": "1Gi", "clients": "16"})],
    ),
    "R5 no policy: as requested": Case(
        [resource_slice([device("gpu-0", capacity={"clients": {"value": "16"}})])],
        claim(request(capacity={"clients": "3"})),
        [("gpu", "gpu-0", {"clients": "3"})],
    ),
    "R5 validValues: smallest value at or above": Case(
        ONE,
        claim(request(capacity={"threads": "30"})),
        [("gpu", "gpu-0", {"memory": "1Gi", "threads": "50"})],
    ),
    # R6: policy
    "R6 above max refused": Case(
        [
            resource_slice(
                [
                    device(
                        "gpu-0",
                        capacity={
                            "memory": {
                                "value": "80Gi",
                                "requestPolicy": {
                                    "default": "1Gi",
                                    "validRange": {"min": "1Gi", "max": "40Gi", "step": "1Gi"},
                                },
                            }
                        },
                    )
                ]
            )
        ],
        claim(request(capacity={"memory": "41Gi"})),
        CannotAllocate,
    ),
    "R6 above every valid value refused": Case(
        [
            resource_slice(
                [device("gpu-0", capacity={"threads": threads(valid=("10", "25", "50"))})]
            )
        ],
        claim(request(capacity={"threads": "60"})),
        CannotAllocate,
    ),
    "R6 default off the grid passes": Case(
        [
            resource_slice(
                [
                    device(
                        "gpu-0",
                        capacity={
                            "memory": {
                                "value": "80Gi",
                                "requestPolicy": {
                                    "default": "1536Mi",
                                    "validRange": {"min": "1Gi", "step": "1Gi"},
                                },
                            }
                        },
                    )
                ]
            )
        ],
        claim(),
        [("gpu", "gpu-0", {"memory": "1536Mi"})],
    ),
    # R7: fit
    "R7 overfill refused": Case(
        ONE,
        claim(request(capacity={"memory": "2Gi"})),
        CannotAllocate,
        [allocated_claim(share("gpu-0", memory="79Gi", threads="10"))],
    ),
    "R7 earlier picks of the same claim count": Case(
        TWO,
        claim(request("a", capacity={"memory": "50Gi"}), request("b", capacity={"memory": "50Gi"})),
        [
            ("a", "gpu-0", {"memory": "50Gi", "threads": "10"}),
            ("b", "gpu-1", {"memory": "50Gi", "threads": "10"}),
        ],
    ),
    # R8: dedicated devices
    "R8 dedicated: no shareID, whole device": Case(
        [resource_slice([device("gpu-0", multiple=False, capacity={})])],
        claim(),
        [("gpu", "gpu-0", None)],
    ),
    "R8 dedicated device in use refused": Case(
        [resource_slice([device("gpu-0", multiple=False, capacity={})])],
        claim(),
        CannotAllocate,
        [allocated_claim({"device": "gpu-0"})],
    ),
    "R8 dedicated device taken by an earlier request": Case(
        [resource_slice([device("gpu-0", multiple=False, capacity={})])],
        claim(request("a"), request("b")),
        CannotAllocate,
    ),
    # R9: shares
    "R9 two claims share a device": Case(
        ONE,
        claim(request(capacity={"memory": "10Gi"})),
        [("gpu", "gpu-0", {"memory": "10Gi", "threads": "10"})],
        [allocated_claim(share("gpu-0", memory="10Gi", threads="10"))],
    ),
    "R9 two requests of one claim share a device": Case(
        ONE, claim(request("a"), request("b")), [("a", "gpu-0", DEFAULTS), ("b", "gpu-0", DEFAULTS)]
    ),
    "R9 count devices are distinct": Case(
        TWO, claim(request(count=2)), [("gpu", "gpu-0", DEFAULTS), ("gpu", "gpu-1", DEFAULTS)]
    ),
    "R9 count more than devices refused": Case(ONE, claim(request(count=2)), CannotAllocate),
    # R10: constraints
    "R10 distinctAttribute": Case(
        TWO,
        claim(request("a"), request("b"), constraints=[{"distinctAttribute": f"{DRIVER}/index"}]),
        [("a", "gpu-0", DEFAULTS), ("b", "gpu-1", DEFAULTS)],
    ),
    "R10 matchAttribute": Case(
        [
            resource_slice(
                [
                    device("gpu-0", attributes={"model": {"string": "x"}}),
                    device("gpu-1", attributes={"model": {"string": "y"}}),
                    device("gpu-2", attributes={"model": {"string": "y"}}),
                ]
            )
        ],
        claim(request(count=2), constraints=[{"matchAttribute": f"{DRIVER}/model"}]),
        [("gpu", "gpu-1", DEFAULTS), ("gpu", "gpu-2", DEFAULTS)],
    ),
    # R11: taints
    "R11 taint excludes": Case(
        [resource_slice([device("gpu-0", taints=[TAINT]), device("gpu-1")])],
        claim(),
        [("gpu", "gpu-1", DEFAULTS)],
    ),
    "R11 NoExecute excludes": Case(
        [resource_slice([device("gpu-0", taints=[{**TAINT, "effect": "NoExecute"}])])],
        claim(),
        CannotAllocate,
    ),
    "R11 effect None does not": Case(
        [resource_slice([device("gpu-0", taints=[{**TAINT, "effect": "None"}])])],
        claim(),
        [("gpu", "gpu-0", DEFAULTS)],
    ),
    "R11 tolerated with Exists": Case(
        [resource_slice([device("gpu-0", taints=[TAINT])])],
        claim(request(tolerations=[{"key": TAINT["key"], "operator": "Exists"}])),
        [("gpu", "gpu-0", DEFAULTS)],
    ),
    "R11 tolerated with Equal": Case(
        [resource_slice([device("gpu-0", taints=[TAINT])])],
        claim(
            request(
                tolerations=[
                    {
                        "key": TAINT["key"],
                        "operator": "Equal",
                        "value": "yes",
                        "effect": "NoSchedule",
                    }
                ]
            )
        ),
        [("gpu", "gpu-0", DEFAULTS)],
    ),
    "R11 wrong value not tolerated": Case(
        [resource_slice([device("gpu-0", taints=[TAINT])])],
        claim(request(tolerations=[{"key": TAINT["key"], "value": "no"}])),
        CannotAllocate,
    ),
    "R11 wrong effect not tolerated": Case(
        [resource_slice([device("gpu-0", taints=[TAINT])])],
        claim(request(tolerations=[{"operator": "Exists", "effect": "NoExecute"}])),
        CannotAllocate,
    ),
    # R12: allocationMode All
    "R12 All leaves out a device that does not fit": Case(
        [resource_slice([device("gpu-0"), device("gpu-1"), device("gpu-2")])],
        claim(request(all_devices=True, capacity={"memory": "10Gi"})),
        [
            ("gpu", "gpu-0", {"memory": "10Gi", "threads": "10"}),
            ("gpu", "gpu-2", {"memory": "10Gi", "threads": "10"}),
        ],
        [allocated_claim(share("gpu-1", memory="75Gi", threads="10"))],
    ),
    "R12 All fails on a device in exclusive use": Case(
        TWO,
        claim(request(all_devices=True)),
        CannotAllocate,
        [allocated_claim({"device": "gpu-1"})],
    ),
    "R12 All fails on an incomplete pool": Case(
        [resource_slice([device("gpu-0")], count=2)],
        claim(request(all_devices=True)),
        CannotAllocate,
    ),
    "R12 All with no device fails": Case(
        ONE,
        claim(request(all_devices=True, selectors=['device.attributes["gpushare.io"].index == 7'])),
        CannotAllocate,
    ),
    # R13: counters
    "R13 counters exhausted": Case(counter_slice("3"), claim(request(count=2)), CannotAllocate),
    "R13 counters enough": Case(
        counter_slice("4"),
        claim(request(count=2)),
        [("gpu", "gpu-0", DEFAULTS), ("gpu", "gpu-1", DEFAULTS)],
    ),
    "R13 a shared device in use skips the check": Case(
        counter_slice("2"),
        claim(),
        [("gpu", "gpu-0", DEFAULTS)],
        [allocated_claim(share("gpu-0", memory="1Gi", threads="10"))],
    ),
    # selectors
    "class selector excludes another driver": Case(
        ONE,
        claim(),
        CannotAllocate,
        classes=[device_class(selectors=['device.driver == "other.io"'])],
    ),
    "capacity selector": Case(
        [resource_slice([device("gpu-0", capacity={"memory": memory("40Gi")}), device("gpu-1")])],
        claim(
            request(
                selectors=['device.capacity["gpushare.io"].memory.compareTo(quantity("64Gi")) >= 0']
            )
        ),
        [("gpu", "gpu-1", DEFAULTS)],
    ),
    "unsupported selector": Case(
        ONE, claim(request(selectors=["device.attributes.size() > 0"])), InvalidClaim
    ),
    "missing attribute is a CEL runtime error": Case(
        ONE,
        claim(request(selectors=['device.attributes["gpushare.io"].model == "x"'])),
        InvalidClaim,
    ),
    "missing class": Case(ONE, claim(request(class_name="nope")), InvalidClaim),
}


def picked(allocation: Obj) -> Expected:
    return [
        (r["request"], r["device"], r.get("consumedCapacity", {}) if "shareID" in r else None)
        for r in allocation["devices"]["results"]
    ]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_rule(case: Case) -> None:
    options = {"slices": case.slices, "classes": case.classes, "allocated": case.allocated}
    if isinstance(case.expected, type):
        with pytest.raises(case.expected):
            allocate_claim(case.claim, NODE, **options)
        return
    allocation = allocate_claim(case.claim, NODE, **options)
    assert picked(allocation) == case.expected
    for result in allocation["devices"]["results"]:
        assert (result["driver"], result["pool"]) == (DRIVER, NODE)


def test_cannot_allocate_says_why_like_kube_scheduler() -> None:
    with pytest.raises(AllocationError, match=r"^cannot allocate all claims$"):
        allocate_claim(claim(request(count=3)), NODE, slices=TWO, classes=[device_class()])


def test_each_share_gets_a_fresh_share_id() -> None:
    allocation = allocate_claim(
        claim(request("a"), request("b")), NODE, slices=ONE, classes=[device_class()]
    )
    ids = [r["shareID"] for r in allocation["devices"]["results"]]
    assert len(set(ids)) == 2 and all(len(i) == 36 for i in ids)


def test_binding_conditions_node_selector_and_timestamp() -> None:
    now = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    slices = [resource_slice([device("gpu-0", binding=True)])]
    allocation = allocate_claim(claim(), NODE, slices=slices, classes=[device_class()], now=now)
    (result,) = allocation["devices"]["results"]
    assert result["bindingConditions"] == ["gpushare.io/admitted"]
    assert result["bindingFailureConditions"] == ["gpushare.io/refused"]
    assert allocation["allocationTimestamp"] == "2026-03-01T12:00:00Z"
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    assert allocation["nodeSelector"] == {"nodeSelectorTerms": [term]}


def test_no_binding_conditions_no_timestamp() -> None:
    allocation = allocate_claim(claim(), NODE, slices=ONE, classes=[device_class()])
    assert "allocationTimestamp" not in allocation
    assert "bindingConditions" not in allocation["devices"]["results"][0]


def test_binding_pools_are_tried_last() -> None:
    slices = [
        resource_slice([device("gpu-0", binding=True)], name="a", pool="a-pool"),
        resource_slice([device("gpu-1")], name="b", pool="b-pool"),
    ]
    allocation = allocate_claim(claim(), NODE, slices=slices, classes=[device_class()])
    assert allocation["devices"]["results"][0]["device"] == "gpu-1"


def test_config_from_class_then_claim_and_tolerations_copied() -> None:
    opaque = {
        "opaque": {"driver": DRIVER, "parameters": {"kind": "ShareConfig", "priority": "burstable"}}
    }
    class_opaque = {
        "opaque": {"driver": DRIVER, "parameters": {"kind": "ShareConfig", "profile": "x"}}
    }
    toleration = {"key": TAINT["key"], "operator": "Exists"}
    wanted = claim(request(tolerations=[toleration]), config=[{"requests": ["gpu"], **opaque}])
    classes = [device_class(config=[class_opaque])]
    allocation = allocate_claim(wanted, NODE, slices=ONE, classes=classes)
    assert allocation["devices"]["config"] == [
        {"source": "FromClass", "requests": ["gpu"], **class_opaque},
        {"source": "FromClaim", "requests": ["gpu"], **opaque},
    ]
    assert allocation["devices"]["results"][0]["tolerations"] == [toleration]


def test_claims_allocated_together_count_each_other() -> None:
    first = claim(request(capacity={"memory": "50Gi"}), name="one")
    second = claim(request(capacity={"memory": "50Gi"}), name="two")
    allocations = allocate([first, second], NODE, slices=TWO, classes=[device_class()])
    assert [a["devices"]["results"][0]["device"] for a in allocations] == ["gpu-0", "gpu-1"]


def test_claim_being_allocated_does_not_count_as_allocated() -> None:
    again = allocated_claim({"device": "gpu-0"})
    allocation = allocate_claim(
        again, NODE, slices=ONE, classes=[device_class()], allocated=[again]
    )
    assert allocation["devices"]["results"][0]["device"] == "gpu-0"


def test_selector_refuses_other_cel() -> None:
    with pytest.raises(UnsupportedSelector, match="not supported"):
        compile_selector('device.attributes["gpushare.io"].index > 1 || true')
