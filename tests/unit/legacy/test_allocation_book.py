"""The kubelet allocations' bookkeeping, as pure decisions: the book folded from its
records (what a restart reads back), which Admit answers start a hold again, and which
ids of an Allocate were never advertised."""

from __future__ import annotations

import pytest

from agent.core.lease import Lease, LeaseState
from agent.core.types import PriorityClass
from agent.legacy.deviceplugin.allocations import AllocationBook
from agent.legacy.deviceplugin.podalloc import holds_again, unadvertised
from agent.legacy.deviceplugin.records import AllocationKind, AllocationRecord

K = AllocationKind


def rec(kind: AllocationKind, lease_id: str = "", *units: str, at: float = 1.0) -> AllocationRecord:
    return AllocationRecord(kind, at, lease_id, tuple(units), f"ns/{lease_id}" if lease_id else "")


U0, U1 = frozenset({"share-0"}), frozenset({"share-1"})


@pytest.mark.parametrize(
    ("records", "taken", "units0", "deferred0"),
    [
        ([], set(), None, False),
        ([rec(K.ALLOCATED, "a", "share-0")], {"a"}, "a", False),
        # the kubelet gave a's units to b (a's pod ended, its lease not yet released): a
        # stays handed out, the units now carry b
        ([rec(K.ALLOCATED, "a", "share-0"), rec(K.ALLOCATED, "b", "share-0")], {"a", "b"}, "b",
         False),
        ([rec(K.DEFERRED, "", "share-0")], set(), None, True),
        # deferred to NRI, then paired again once NRI was gone: checked with PodResources
        ([rec(K.DEFERRED, "", "share-0"), rec(K.ALLOCATED, "b", "share-0")], {"b"}, "b", False),
        ([rec(K.ALLOCATED, "a", "share-0"), rec(K.DEFERRED, "", "share-0")], {"a"}, None, True),
        ([rec(K.ALLOCATED, "a")], {"a"}, None, False),  # by the runtime (NRI): no units
        ([rec(K.GRANTED, "a")], set(), None, False),  # a grant hands nothing out
        ([rec(K.CHECKED, "a", "share-0")], set(), None, False),
    ],
)  # fmt: skip
def test_the_book_folded_from_its_records(
    records: list[AllocationRecord], taken: set[str], units0: str | None, deferred0: bool
) -> None:
    book = AllocationBook.replay(records)
    assert set(book.taken) == taken
    assert book.lease_of(U0) == units0
    assert book.deferred(U0) is deferred0
    assert book.lease_of(U1) is None and not book.deferred(U1)


def test_grants_and_pods_folded() -> None:
    book = AllocationBook.replay(
        [
            rec(K.GRANTED, "a", at=5.0),
            rec(K.GRANTED, "a", at=9.0),
            rec(K.GRANTED, "a", at=7.0),  # never earlier than a later one
            rec(K.ALLOCATED, "a", "share-0"),
            rec(K.CHECKED, "a", "share-0"),
        ]
    )
    assert book.granted_at == {"a": 9.0}
    assert book.pod_of("a") == "ns/a" and book.pod_of("b") == ""


def test_a_lease_being_written_is_taken_until_its_write_settles() -> None:
    book = AllocationBook()
    book.hold("a")
    book.hold("a")
    assert set(book.taken) == {"a"} and not book.handed_out("a")
    book.unhold("a")
    assert set(book.taken) == {"a"}
    book.unhold("a")  # failed: never handed out
    assert set(book.taken) == set()


def test_forgetting_keeps_live_leases_and_deferred_units() -> None:
    book = AllocationBook.replay(
        [
            rec(K.ALLOCATED, "gone", "share-0"),
            rec(K.ALLOCATED, "live", "share-1"),
            rec(K.DEFERRED, "", "share-2"),
            rec(K.GRANTED, "gone"),
        ]
    )
    book.forget_all_but({"live"})
    assert set(book.taken) == {"live"}
    assert book.lease_of(U0) is None and book.lease_of(U1) == "live"
    assert book.deferred(frozenset({"share-2"})) and book.granted_at == {}


def lease(state: LeaseState = LeaseState.ADMITTED, pod: str = "ns/a", at: float = 10.0) -> Lease:
    base = Lease(
        "a", "uid-a", "t", "t", "GPU-1", PriorityClass.BURSTABLE, 2**30, 25, state, at, at,
        pod=pod,
    )  # fmt: skip
    return base


@pytest.mark.parametrize(
    ("answered", "asked_at", "taken", "granted_at", "expected"),
    [
        (lease(), 50.0, set(), {}, True),  # granted at 10, asked again at 50
        (lease(at=50.0), 50.0, set(), {}, False),  # made by this very Admit
        (lease(at=60.0), 50.0, set(), {}, False),  # made after the Admit began: new
        (lease(), 50.0, {"a"}, {}, False),  # the kubelet has it: nothing to wait for
        (lease(), 50.0, set(), {"a": 50.0}, False),  # already granted again then
        (lease(), 50.0, set(), {"a": 40.0}, True),  # granted again before: again now
        (lease(pod=""), 50.0, set(), {}, False),  # not a pod's lease
        (lease(LeaseState.RESERVED), 50.0, set(), {}, False),  # its hold starts at commit
        (lease(LeaseState.READY), 50.0, set(), {}, False),  # its container runs
    ],
)  # fmt: skip
def test_which_answers_start_a_hold_again(
    answered: Lease, asked_at: float, taken: set[str], granted_at: dict[str, float], expected: bool
) -> None:
    assert holds_again(answered, asked_at, taken=taken, granted_at=granted_at) is expected


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        (["share-0"], []),
        (["share-3", "share-0"], []),
        (["share-4"], ["share-4"]),
        (["share-0", "share-99", "share-99"], ["share-99"]),
        (["GPU-0", "share-1"], ["GPU-0"]),
        ([], []),  # none at all: refused by the allocator on its own
    ],
)
def test_ids_never_advertised(ids: list[str], expected: list[str]) -> None:
    assert unadvertised(ids, {"share-0", "share-1", "share-2", "share-3"}) == expected
