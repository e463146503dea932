"""The stale-context planner, rule by rule (pure: facts in, actions out)."""

from __future__ import annotations

import dataclasses

import pytest

from agent.core.lease import CLAIM_OWNER, Lease, LeaseState
from agent.core.mpsstate import MpsDaemonState, MpsServerState
from agent.core.types import PriorityClass
from agent.core.units import GIB
from agent.mps.stale import (
    ActionKind,
    Facts,
    Memory,
    Policy,
    ProcessFact,
    ProcessState,
    plan,
)

DEV = "GPU-0"
SERVER = 900
ALIVE, ZOMBIE, GONE = ProcessState.ALIVE, ProcessState.ZOMBIE, ProcessState.GONE


def lease(lease_id: str, state: LeaseState = LeaseState.READY, pids: tuple[int, ...] = ()) -> Lease:
    return Lease(
        lease_id,
        f"r-{lease_id}",
        "t",
        "a",
        DEV,
        PriorityClass.BURSTABLE,
        4 * GIB,
        25.0,
        state,
        0.0,
        0.0,
        client_pids=pids,
    )


def daemon(*clients: int) -> MpsDaemonState:
    servers = (MpsServerState(SERVER, clients),) if clients else ()
    return MpsDaemonState(DEV, up=True, backend="test", servers=servers)


def facts(
    clients: tuple[int, ...],
    processes: dict[int, ProcessFact],
    leases: tuple[Lease, ...] = (),
    **more: object,
) -> Facts:
    return Facts(
        now=more.pop("now", 100.0),  # type: ignore[arg-type]
        daemons=[daemon(*clients)],
        leases=list(leases),
        processes=processes,
        **more,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("process", "unknown", "expected"),
    [
        (ProcessFact(GONE), "report", [ActionKind.TERMINATE]),
        (ProcessFact(ZOMBIE), "report", [ActionKind.TERMINATE]),
        (ProcessFact(ALIVE, "l-1"), "report", []),  # alive, its lease is live
        (ProcessFact(ALIVE, None), "report", [ActionKind.REPORT_UNKNOWN]),
        (ProcessFact(ALIVE, "l-ended"), "report", [ActionKind.REPORT_UNKNOWN]),
        (ProcessFact(ALIVE, None), "terminate", [ActionKind.TERMINATE]),
    ],
)
def test_each_client_by_its_process(
    process: ProcessFact, unknown: str, expected: list[ActionKind]
) -> None:
    actions, _ = plan(
        facts((41,), {41: process}, (lease("l-1", pids=(41,)),)),
        Memory(),
        Policy(unknown_clients=unknown),
    )
    assert [a.kind for a in actions] == expected
    for action in actions:
        assert action.clients == ((SERVER, 41),) and action.device_uuid == DEV


def test_a_client_is_terminated_once_and_forgotten_when_mps_stops_listing_it() -> None:
    gone = facts((41,), {41: ProcessFact(GONE)})
    first, memory = plan(gone, Memory(), Policy())
    second, memory = plan(gone, memory, Policy())
    assert [a.kind for a in first] == [ActionKind.TERMINATE] and second == []
    _, memory = plan(facts((), {}), memory, Policy())
    assert memory.terminated == frozenset(), "a reused PID is judged afresh"


def test_an_unknown_client_is_reported_once() -> None:
    unknown = facts((41,), {41: ProcessFact(ALIVE)})
    first, memory = plan(unknown, Memory(), Policy())
    second, _ = plan(unknown, memory, Policy())
    assert [a.kind for a in first] == [ActionKind.REPORT_UNKNOWN] and second == []


@pytest.mark.parametrize(
    ("state", "processes", "first_seen", "now", "released"),
    [
        (LeaseState.READY, {41: ProcessFact(GONE)}, None, 100.0, False),  # starts the grace
        (LeaseState.READY, {41: ProcessFact(GONE)}, 100.0, 159.0, False),  # within grace
        (LeaseState.READY, {41: ProcessFact(GONE)}, 100.0, 160.0, True),  # grace over
        (LeaseState.READY, {41: ProcessFact(ZOMBIE)}, 100.0, 160.0, True),
        (LeaseState.READY, {41: ProcessFact(ALIVE, "l-1")}, 100.0, 160.0, False),
        (LeaseState.READY, {42: ProcessFact(ALIVE, "l-1")}, 100.0, 160.0, False),  # a new one
        (LeaseState.ADMITTED, {}, 0.0, 160.0, False),  # not ready: readiness's business
    ],
)
def test_a_ready_lease_whose_processes_exited_is_released_after_the_grace(
    state: LeaseState,
    processes: dict[int, ProcessFact],
    first_seen: float | None,
    now: float,
    released: bool,
) -> None:
    held = lease("l-1", state, pids=(41,))
    memory = Memory(exited_since={"l-1": first_seen} if first_seen is not None else {})
    actions, after = plan(facts((), processes, (held,), now=now), memory, Policy(exit_grace_s=60))
    kinds = [a.kind for a in actions if a.kind is ActionKind.RELEASE]
    assert kinds == ([ActionKind.RELEASE] if released else [])
    if state is LeaseState.READY and not any(p.state is ALIVE for p in processes.values()):
        assert after.exited_since["l-1"] == (first_seen if first_seen is not None else now)
    else:
        assert "l-1" not in after.exited_since


def test_a_fault_fails_every_lease_of_the_device_and_clears_its_server() -> None:
    held = (lease("l-1", pids=(41,)), lease("l-2", LeaseState.ADMITTED))
    actions, _ = plan(
        facts(
            (41, 42), {41: ProcessFact(GONE), 42: ProcessFact(ALIVE)}, held, faults={DEV: "Xid 79"}
        ),
        Memory(),
        Policy(),
    )
    assert [a.kind for a in actions] == [ActionKind.FAIL_DEVICE], "nothing else on that device"
    (fail,) = actions
    assert fail.lease_ids == ("l-1", "l-2")
    assert fail.clients == ((SERVER, 41), (SERVER, 42))
    assert fail.server_pids == (SERVER,)
    assert "Xid 79" in fail.description


@pytest.mark.parametrize(
    ("used_gib", "policy", "before", "expected_clients"),
    [
        (3, "report", frozenset(), None),  # under its 4 GiB limit
        (5, "report", frozenset(), ()),  # a violation, reported
        (5, "report", frozenset({"l-1"}), None),  # still over: already reported
        (5, "enforce", frozenset(), ((SERVER, 41),)),  # its clients terminated
    ],
)
def test_memory_over_the_limit(
    used_gib: int,
    policy: str,
    before: frozenset[str],
    expected_clients: tuple[tuple[int, int], ...] | None,
) -> None:
    actions, after = plan(
        facts(
            (41,),
            {41: ProcessFact(ALIVE, "l-1", by_cgroup=True)},
            (lease("l-1", pids=(41,)),),
            memory_used={"l-1": used_gib * GIB},
        ),
        Memory(violating=before),
        Policy(memory=policy),
    )
    violations = [a for a in actions if a.kind is ActionKind.MEMORY_VIOLATION]
    if expected_clients is None:
        assert violations == []
    else:
        assert [v.clients for v in violations] == [expected_clients]
        assert "over its limit" in violations[0].description
    assert ("l-1" in after.violating) == (used_gib > 4)


def test_memory_is_a_pure_value() -> None:
    memory = Memory()
    plan(facts((41,), {41: ProcessFact(GONE)}), memory, Policy())
    assert memory == Memory(), "the planner never changes what it was given"
    assert dataclasses.is_dataclass(memory)


def test_enforce_terminates_only_the_clients_the_cgroup_says_are_the_leases() -> None:
    """A client attributed by its GPUSHARE_LEASE_ID alone may be anyone's: a lease's memory
    never gets it terminated (nor, through it, the lease's own clients)."""
    actions, _ = plan(
        facts(
            (41, 42, 43),
            {
                41: ProcessFact(ALIVE, "l-1", by_cgroup=True),
                42: ProcessFact(ALIVE, "l-1"),  # by the hint only
                43: ProcessFact(ALIVE, "l-2", by_cgroup=True),  # another lease's
            },
            (lease("l-1", pids=(41,)), lease("l-2", pids=(43,))),
            memory_used={"l-1": 5 * GIB},
        ),
        Memory(),
        Policy(memory="enforce"),
    )
    (violation,) = [a for a in actions if a.kind is ActionKind.MEMORY_VIOLATION]
    assert violation.clients == ((SERVER, 41),)
    assert "1 client(s) known by their GPUSHARE_LEASE_ID only" in violation.description
    hint_only, _ = plan(
        facts(
            (42,), {42: ProcessFact(ALIVE, "l-1")}, (lease("l-1"),), memory_used={"l-1": 5 * GIB}
        ),
        Memory(),
        Policy(memory="enforce"),
    )
    assert [a.clients for a in hint_only] == [()], "reported, never enforced"


def test_a_dra_claims_lease_is_not_released_when_its_processes_exit() -> None:
    """Its container may restart; the kubelet's Unprepare ends it."""
    held = dataclasses.replace(lease("l-1", pids=(41,)), owner=CLAIM_OWNER)
    memory = Memory(exited_since={"l-1": 0.0})
    actions, _ = plan(facts((), {41: ProcessFact(GONE)}, (held,), now=1000.0), memory, Policy())
    assert [a for a in actions if a.kind is ActionKind.RELEASE] == []


@pytest.mark.parametrize(
    ("owner", "node_policy", "claim_policy", "terminates"),
    [
        ("", "report", "enforce", False),  # a lease admitted over gRPC: janitor.memory_policy
        ("", "enforce", "report", True),
        (CLAIM_OWNER, "report", "enforce", True),  # a claim's share: dra.memory_policy
        (CLAIM_OWNER, "enforce", "report", False),
    ],
)
def test_each_kind_of_lease_has_its_memory_policy(
    owner: str, node_policy: str, claim_policy: str, terminates: bool
) -> None:
    held = dataclasses.replace(lease("l-1", pids=(41,)), owner=owner)
    actions, _ = plan(
        facts(
            (41,),
            {41: ProcessFact(ALIVE, "l-1", by_cgroup=True)},
            (held,),
            memory_used={"l-1": 5 * GIB},
        ),
        Memory(),
        Policy(memory=node_policy, claim_memory=claim_policy),
    )
    (violation,) = [a for a in actions if a.kind is ActionKind.MEMORY_VIOLATION]
    assert bool(violation.clients) is terminates
