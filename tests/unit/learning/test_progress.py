"""Progress reports to run records (agent.learning.progress), as tables of timed steps:
compositions of a device, progress reports, telemetry windows and lease ends, and the
records that come out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from agent.core.errors import ValidationError
from agent.core.lease import Lease, LeaseState
from agent.core.types import Device, PriorityClass
from agent.core.units import GIB
from agent.estimator.records import Workload, parse_lines, to_json
from agent.learning.progress import NodeRecord, ProgressTracker
from tests.helpers import FakeClock

GPU = Device("GPU-a", 0, "H100-SXM5-80GB", 80 * GIB)
OTHER = Device("GPU-b", 1, "H100-SXM5-80GB", 80 * GIB)
MIN_SPAN_S = 10.0


def lease(
    lease_id: str,
    *,
    state: LeaseState = LeaseState.ADMITTED,
    profile: str | None = None,
    workload: str = "",
    device: Device = GPU,
) -> Lease:
    return Lease(
        lease_id, f"r-{lease_id}", "t", "t", device.uuid, PriorityClass.BURSTABLE, 4 * GIB, 25.0,
        state, 0.0, 0.0, profile=profile, workload=workload,
    )  # fmt: skip


LEASES = {x: lease(x) for x in "ABC"}


@dataclass(frozen=True)
class On:
    """The running set of a device changes to these leases (ids of LEASES, or Leases)."""

    leases: Sequence[str | Lease]
    device: Device = GPU


@dataclass(frozen=True)
class Report:
    lease_id: str
    units: float


@dataclass(frozen=True)
class End:
    lease_id: str


Step = tuple[float, On | Report | End]


def tracker(clock: FakeClock, *, pending: int = 16) -> ProgressTracker:
    return ProgressTracker(
        clock=clock,
        min_span_s=MIN_SPAN_S,
        workload_of=lambda x: Workload(
            "w", x.thread_pct, 0, {"sm_active": x.thread_pct / 100}, "", {50.0: {"sm_active": 0.4}}
        ),
        pending_per_lease=pending,
    )


def play(steps: Sequence[Step], *, pending: int = 16) -> tuple[ProgressTracker, list[NodeRecord]]:
    clock = FakeClock(0.0)
    t = tracker(clock, pending=pending)
    made: list[NodeRecord] = []
    for at_s, step in steps:
        clock.now = at_s
        if isinstance(step, On):
            members = [LEASES[x] if isinstance(x, str) else x for x in step.leases]
            t.composition(step.device, members)
        elif isinstance(step, Report):
            t.report(step.lease_id, step.units)
        else:
            t.forget(step.lease_id)
        made += t.take()
    return t, made


def summary(records: list[NodeRecord]) -> list[tuple[str, tuple[str, ...], float]]:
    return [
        (r.lease_id, tuple(p.workload for p in r.record.peers), r.record.retention or 0.0)
        for r in records
    ]


def script(text: str) -> list[Step]:
    """Steps written ``AT WHAT`` and separated by ``;``: ``on AB`` (the running set of
    GPU-a; ``on B@b``: of GPU-b; ``on -``: none), ``A=100`` (a report), ``end A``."""
    steps: list[Step] = []
    for item in filter(None, (x.strip() for x in text.split(";"))):
        at, what = item.split(" ", 1)
        if what.startswith("on "):
            names, _, where = what[3:].partition("@")
            ids = "" if names == "-" else names
            steps.append((float(at), On(ids, OTHER if where == "b" else GPU)))
        elif what.startswith("end "):
            steps.append((float(at), End(what[4:])))
        else:
            name, units = what.split("=")
            steps.append((float(at), Report(name, float(units))))
    return steps


# A alone from 0 to 20 at 10 units/s; B joins at 20; from 20 to 40 A does 5 units/s.
SOLO_FIRST = "0 on A; 0 A=0; 20 A=200; 20 on AB; 20 A=200;"

CASES = {
    "solo rate known before: the co-located window is a record when it closes": (
        f"{SOLO_FIRST} 40 A=300; 40 on A",
        [("A", ("B",), 0.5)],
    ),
    "solo rate known after: the co-located window waits, then becomes a record": (
        "0 on AB; 0 A=0; 20 A=100; 20 on A; 20 A=100; 30 A=200",
        [("A", ("B",), 0.5)],
    ),
    "a solo span under the window is no solo rate": (
        "0 on A; 0 A=0; 5 A=50; 5 on AB; 5 A=50; 25 A=150; 25 on A",
        [],
    ),
    "a co-located span under the window is no record": (
        f"{SOLO_FIRST} 29 A=245; 29 on A",
        [],
    ),
    "one report in a window is no rate": (f"{SOLO_FIRST} 40 on A", []),
    "a peer that ends mid-window closes it: a record from the reports so far": (
        f"{SOLO_FIRST} 35 A=275; 35 on A; 35 end B",
        [("A", ("B",), 0.5)],
    ),
    "the target that ends mid-window still gets its record": (
        f"{SOLO_FIRST} 35 A=275; 35 on B; 35 end A",
        [("A", ("B",), 0.5)],
    ),
    "each co-located window is its own record, peers as they were": (
        f"{SOLO_FIRST} 40 A=300; 40 on A; 40 A=300; 50 A=400; 50 on AC; 50 A=400; 60 A=480; "
        "60 on ABC; 60 A=480; 80 A=560; 80 on A",
        [("A", ("B",), 0.5), ("A", ("C",), 0.8), ("A", ("B", "C"), 0.4)],
    ),
    "the latest solo rate is the one used": (
        f"{SOLO_FIRST} 40 A=300; 40 on A; 40 A=300; 60 A=400; 60 on AB; 60 A=400; 80 A=500; "
        "80 on A",
        [("A", ("B",), 0.5), ("A", ("B",), 1.0)],
    ),
    "no record past twice the solo rate (a warm-up solo)": (f"{SOLO_FIRST} 40 A=1200; 40 on A", []),
    "no progress next to others is retention 0": (
        f"{SOLO_FIRST} 40 A=200; 40 on A",
        [("A", ("B",), 0.0)],
    ),
    "no progress alone is no solo rate": (
        "0 on A; 0 A=0; 20 A=0; 20 on AB; 20 A=0; 40 A=10; 40 on A",
        [],
    ),
    "both leases of a window become records once each has a solo rate": (
        "0 on AB; 0 A=0; 0 B=0; 20 A=100; 20 B=40; 20 on A; 20 on B@b; 20 A=100; 20 B=40; "
        "30 A=200; 30 B=80",
        [("A", ("B",), 0.5), ("B", ("A",), 0.5)],
    ),
}


def test_a_reservation_runs_nothing_and_turning_ready_changes_no_set() -> None:
    reserved = lease("R", state=LeaseState.RESERVED)
    ready = lease("A", state=LeaseState.READY)
    steps = [
        (0.0, On(["A", reserved])),  # A is alone: R holds capacity but runs nothing
        *script("0 A=0; 5 A=50"),
        (5.0, On([ready, reserved])),  # the same running set: the window goes on
        *script("20 A=200; 20 on AB; 20 A=200; 40 A=300; 40 on A"),
    ]
    _t, made = play(steps)
    assert summary(made) == [("A", ("B",), 0.5)]


@pytest.mark.parametrize(("steps", "expected"), CASES.values(), ids=CASES.keys())
def test_windows_to_records(steps: str, expected: list[tuple[str, tuple[str, ...], float]]) -> None:
    _t, made = play(script(steps))
    assert summary(made) == expected


def test_waiting_windows_are_bounded_oldest_out() -> None:
    # three co-located windows where A does 1, 2, then 3 units/s; then 4 units/s alone
    steps = script(
        "0 on AB; 0 A=0; 10 A=10; 20 on AC; 20 A=100; 30 A=120; 40 on AB; 40 A=200; "
        "50 A=230; 60 on A; 60 A=500; 70 A=540"
    )
    t, made = play(steps[:-2], pending=2)
    assert t.pending("A") == 2 and not made
    t, made = play(steps, pending=2)
    assert t.pending("A") == 0
    assert summary(made) == [("A", ("C",), 0.5), ("A", ("B",), 0.75)]  # solo 4 units/s


def test_a_lease_that_ended_is_forgotten_with_its_waiting_windows() -> None:
    t, made = play(script("0 on AB; 0 A=0; 20 A=100; 20 on B"))
    assert t.pending("A") == 1 and not made
    t.forget("A")
    assert t.pending("A") == 0 and t.solo_rate("A") is None


def test_a_solo_rate_is_known_while_the_window_is_open() -> None:
    t, _made = play(script("0 on A; 0 A=0; 9 A=90"))
    assert t.solo_rate("A") is None
    clock = FakeClock(0.0)
    t = tracker(clock)
    t.composition(GPU, [LEASES["A"]])
    t.report("A", 0)
    clock.now = 12
    answer = t.report("A", 36)
    assert t.solo_rate("A") == 3.0
    assert (answer.window_s, answer.rate_per_s, answer.peers) == (12.0, 3.0, 0)


@pytest.mark.parametrize("units", [-1.0, math.nan, math.inf, -math.inf])
def test_units_must_be_finite_and_not_negative(units: float) -> None:
    t = tracker(FakeClock(0.0))
    with pytest.raises(ValidationError, match="units_done: must be a finite number >= 0"):
        t.report("A", units)


def test_units_never_go_backwards() -> None:
    clock = FakeClock(0.0)
    t = tracker(clock)
    t.composition(GPU, [LEASES["A"]])
    t.report("A", 100)
    t.report("A", 100)  # no progress is no error
    with pytest.raises(ValidationError, match="went backwards: 99 after 100"):
        t.report("A", 99)
    clock.now = 20
    assert t.report("A", 300).rate_per_s == 10.0  # the refused report changed nothing
    t.composition(GPU, [])
    t.forget("A")
    t.report("A", 0)  # a lease forgotten starts again (its id is never reused)


def test_a_lease_on_no_window_reports_without_a_rate() -> None:
    answer = tracker(FakeClock(0.0)).report("Z", 5)
    assert (answer.lease_id, answer.window_s, answer.rate_per_s, answer.records) == (
        "Z",
        0.0,
        0.0,
        0,
    )


def test_a_record_describes_the_device_target_and_peers() -> None:
    a = lease("A", profile="resnet50")
    b = lease("B", workload="pod:1234")
    clock = FakeClock(0.0)
    t = tracker(clock)
    steps: list[tuple[float, object]] = [
        (0, [a]), (0, ("A", 0)), (20, ("A", 200)), (20, [a, b]), (20, ("A", 200)),
        (40, ("A", 300)), (40, [a]),
    ]  # fmt: skip
    for at_s, step in steps:
        clock.now = at_s
        if isinstance(step, list):
            t.composition(GPU, step)
        else:
            assert isinstance(step, tuple)
            t.report(*step)
    [made] = t.take()
    assert (made.lease_id, made.family) == ("A", "resnet50")
    record = made.record
    assert (record.gpu_model, record.gpu_memory_bytes) == (GPU.model, GPU.memory_bytes)
    assert (record.target.workload, record.target.family) == ("resnet50", "resnet50")
    assert (record.target.thread_pct, record.target.memory_bytes) == (25.0, 4 * GIB)
    assert record.target.counters == {"sm_active": 0.25}
    # what the gate reads at admission: the profile's counters at MPS shares too
    assert record.target.share_counters == {50.0: {"sm_active": 0.4}}
    [peer] = record.peers
    assert (peer.workload, peer.family) == ("pod:1234", "pod:1234")
    assert record.device_counters is None and record.retention == 0.5
    assert record.retention_basis == "share", "set against its rate alone at its share"
    [back] = parse_lines([to_json(record)], need_retention=True)
    assert back == record
    assert t.records_total == 1 and t.report("A", 300).records == 1


def test_a_lease_with_neither_profile_nor_workload_is_named_by_its_id() -> None:
    _t, made = play(script(f"{SOLO_FIRST} 40 A=300; 40 on A"))
    assert (made[0].record.target.workload, made[0].family) == ("A", "unknown")


def test_device_counters_are_the_mean_of_the_telemetry_windows_inside() -> None:
    clock = FakeClock(0.0)
    t = tracker(clock)
    t.composition(GPU, [LEASES["A"]])
    t.report("A", 0)
    clock.now = 20
    t.report("A", 200)
    t.composition(GPU, [LEASES["A"], LEASES["B"]])
    t.report("A", 200)
    clock.now = 25
    t.telemetry(GPU.uuid, {"sm_active": 0.1}, started_s_ago=10)  # began before: not it
    t.telemetry(GPU.uuid, {"sm_active": 0.6, "dram_active": 0.2}, started_s_ago=5)
    clock.now = 30
    t.telemetry(GPU.uuid, {"sm_active": 0.8, "dram_active": 0.4}, started_s_ago=5)
    t.telemetry(OTHER.uuid, {"sm_active": 0.0}, started_s_ago=1)  # another device
    clock.now = 40
    t.report("A", 300)
    t.composition(GPU, [LEASES["A"]])
    [made] = t.take()
    assert made.record.device_counters == pytest.approx({"sm_active": 0.7, "dram_active": 0.3})


def test_a_forgotten_lease_still_in_a_window_is_kept() -> None:
    clock = FakeClock(0.0)
    t = tracker(clock)
    t.composition(GPU, [LEASES["A"]])
    t.report("A", 0)
    t.forget("A")  # told out of order: its window is still open
    clock.now = 20
    assert t.report("A", 200).rate_per_s == 10.0
