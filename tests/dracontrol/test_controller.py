"""The binding-answer controller against the API stand-in, through the real adapter, with
the nodes' agents played by a decider that records its asks: every share that waits gets
its agent's word in ``status.devices`` once, whatever the status write's outcome (the
table of issue 37, observation 8, re-homed from the agent), an answer not written stays
owed (tried again, the claim read first) until written or the claim gone or no longer
waiting, an agent that cannot be reached keeps its claims owed and is never answered for,
and a relist starts no second task."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from agent.dra.claims import ADMITTED as ADMITTED_TYPE
from agent.dracontrol.controller import answer_condition, waiting_pools
from agent.dracontrol.port import ShareAnswerValue
from agent.kubeapi.rest import RestKubeApi
from tests.dracontrol.helpers import (
    NODE,
    STATUS,
    Agents,
    claim,
    claim_on,
    conditions,
    controlling,
    status_writes,
    stored,
    tasks_of,
    until,
)
from tests.kubeworld.apiserver import FakeApiServer

ADMITTED = [("gpu-0", "gpushare.io/admitted", "Admitted")]
REFUSED = [("gpu-0", "gpushare.io/refused", "NO_MEMORY")]
FOREVER = 10**6  # a fault's count that outlasts any test: removed to end the outage

Fault = Callable[[FakeApiServer], Awaitable[None]]


# -- which claims wait, and what is written --------------------------------------------------


def test_only_results_of_the_driver_with_binding_conditions_and_no_answer_wait() -> None:
    two = claim_on("c", [("node-a", "gpu-0"), ("node-b", "gpu-1"), ("node-a", "gpu-2")])
    assert waiting_pools(two) == ["node-a", "node-b"]
    assert waiting_pools(claim("c", "gpu-0", driver="other.io")) == []
    assert waiting_pools(claim("c", "gpu-0", binding=False)) == []
    assert waiting_pools({"metadata": {"name": "c"}}) == []  # not allocated
    answered = claim("c", "gpu-0")
    answered["status"]["devices"] = [
        {
            "driver": "gpushare.io",
            "pool": NODE,
            "device": "gpu-0",
            "shareID": answered["status"]["allocation"]["devices"]["results"][0]["shareID"],
            "conditions": [answer_condition(ShareAnswerValue("gpu-0", "", True, "", ""), "t")],
        }
    ]
    assert waiting_pools(answered) == []
    # a result the agent will refuse (a device name Admit would not take) waits all the same
    bad = claim("c", "gpu 0\n")
    assert waiting_pools(bad) == [NODE]


@pytest.mark.parametrize(
    ("reason", "written"),
    [
        ("NO_MEMORY", "NO_MEMORY"),
        ("", "Refused"),
        ("no memory!", "Refused"),
        ("x" * 200, "Refused"),
    ],
)
def test_a_refusal_reason_is_written_only_where_a_condition_may_carry_it(
    reason: str, written: str
) -> None:
    cond = answer_condition(
        ShareAnswerValue("gpu-0", "s", False, reason, ""), "2026-01-01T00:00:00Z"
    )
    assert (cond["type"], cond["reason"], cond["status"]) == (
        "gpushare.io/refused",
        written,
        "True",
    )
    assert cond["message"]  # required by the API


# -- the status write's outcomes ------------------------------------------------------------


def injected(status: int, times: int = 1, **how: Any) -> Fault:
    async def fault(api: FakeApiServer) -> None:
        api.fail_next("PUT", STATUS, status, times=times, **how)

    return fault


def meanwhile(change: Callable[[FakeApiServer], object]) -> Fault:
    """The claim changes between the controller's read and its write (the write is held)."""

    async def fault(api: FakeApiServer) -> None:
        hold = api.hold_next("PUT", STATUS)
        await hold.arrived.wait()
        change(api)
        hold.release.set()

    return fault


def relabelled(api: FakeApiServer) -> None:
    changed = stored(api)
    assert changed is not None
    changed["metadata"].setdefault("labels", {})["touched"] = "yes"
    api.put_object("resourceclaims", changed)


@dataclass
class Row:
    fault: Fault | None
    writes: int  # status writes sent
    answer: list[tuple[str, str, str]] | None  # None: the claim is gone
    leases: int  # distinct shares the agent admitted (asked again: the same)
    full: frozenset[str] = frozenset()
    confirmed: bool = True  # the write that landed was answered (counted as written)
    # the level of the "not written" lines: transient failures warn; the API refusing the
    # write (RBAC, validation: a person must act) is an error; None: no such line
    logged: int | None = None


ERROR, WARNING = logging.ERROR, logging.WARNING
ROWS = {
    "done": Row(None, 1, ADMITTED, 1),
    # RBAC or validation: logged, tried again with backoff until it is fixed
    "refused by the API, then allowed": Row(
        injected(403, 6, reason="Forbidden"), 7, ADMITTED, 1, logged=ERROR
    ),
    "invalid (422), then taken": Row(
        injected(422, 6, reason="Invalid"), 7, ADMITTED, 1, logged=ERROR
    ),
    # the API server's rate limit (or its priority and fairness): transient, a warning
    "too many requests (429), then taken": Row(
        injected(429, 6, reason="TooManyRequests"), 7, ADMITTED, 1, logged=WARNING
    ),
    "failed, not done": Row(injected(503, 6), 7, ADMITTED, 1, logged=WARNING),
    # read again: found answered, not written twice
    "failed but done": Row(
        injected(500, landed=True), 1, ADMITTED, 1, confirmed=False, logged=WARNING
    ),
    "timed out, done": Row(
        injected(0, hang=True, landed=True), 1, ADMITTED, 1, confirmed=False, logged=WARNING
    ),
    "timed out, not done": Row(injected(0, hang=True), 2, ADMITTED, 1, logged=WARNING),
    "conflict: changed meanwhile": Row(meanwhile(relabelled), 2, ADMITTED, 1),
    "not found: deleted meanwhile": Row(
        meanwhile(lambda api: api.delete_object("resourceclaims", "ns", "c")), 1, None, 1
    ),
    "a refusal, its write failing": Row(
        injected(503, 6), 7, REFUSED, 0, frozenset({"gpu-0"}), logged=WARNING
    ),
}  # fmt: skip


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
async def test_each_outcome_of_the_status_write(
    api: FakeApiServer, kube: RestKubeApi, row: Row, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent.dracontrol.controller")
    agents = Agents(full=row.full)
    async with controlling(kube, agents) as controller, asyncio.TaskGroup() as faults:
        if row.fault is not None:
            faults.create_task(row.fault(api))
            await asyncio.sleep(0)  # the fault is in place before the claim comes
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        settled = (lambda: stored(api) is None) if row.answer is None else None
        await until(settled or (lambda: bool(conditions(api))))
        await until(lambda: not controller.owing)
        await asyncio.sleep(0.3)  # nothing more comes
    assert status_writes(api) == row.writes
    assert (conditions(api) if stored(api) else None) == row.answer
    assert len(agents.leases) == row.leases
    assert {node for node, _ in agents.asks} == {NODE}
    written = 1 if row.answer is not None and row.confirmed else 0
    assert controller.counters.answers_written == written
    assert controller.counters.refusals_written == (written if row.full else 0)
    levels = {r.levelno for r in caplog.records if "not written" in r.getMessage()}
    assert levels == ({row.logged} if row.logged is not None else set())


# -- owed ----------------------------------------------------------------------------------


async def test_an_answer_owed_through_an_outage_is_written_once_the_api_recovers(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    """Status writes fail with 503 for longer than any fixed number of tries, and the
    watch ends meanwhile: once the writes go through again the claim is answered."""
    agents = Agents()
    outage = api.fail_next("PUT", STATUS, 503, times=FOREVER)
    async with controlling(kube, agents) as controller:
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: status_writes(api) >= 8)
        assert controller.owing == 1
        api.end_watches()
        api.faults.remove(outage)  # the API server recovers
        await until(lambda: bool(conditions(api)), timeout_s=3.0)
        await until(lambda: not controller.owing)
    assert conditions(api) == ADMITTED
    assert len(agents.leases) == 1 and controller.counters.answers_written == 1


CLAIM = r"/namespaces/ns/resourceclaims/c$"  # the GET of claim ns/c (read again)


def rereads(api: FakeApiServer) -> int:
    return sum(1 for method, p, _ in api.log if method == "GET" and p.endswith("/resourceclaims/c"))


@pytest.mark.parametrize(
    "fault",
    [{"status": 500}, {"status": 0, "hang": True}],
    ids=["failed (500)", "timed out"],
)
async def test_a_claim_whose_read_again_fails_stays_owed_until_the_api_answers(
    api: FakeApiServer, kube: RestKubeApi, fault: dict[str, Any]
) -> None:
    """The first write fails, so the next try reads the claim first; those reads fail (or
    get no answer within the client's timeout) for a while: nothing is asked or written
    meanwhile, and once the reads go through the claim is answered, once."""
    agents = Agents()
    api.fail_next("PUT", STATUS, 503)
    outage = api.fail_next("GET", CLAIM, times=FOREVER, **fault)
    async with controlling(kube, agents) as controller:
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: rereads(api) >= 3, timeout_s=15.0)
        assert controller.owing == 1 and status_writes(api) == 1 and not conditions(api)
        assert len(agents.asks) == 1  # not asked again before the claim is read
        api.faults.remove(outage)
        await until(lambda: bool(conditions(api)), timeout_s=5.0)
        await until(lambda: not controller.owing)
    assert conditions(api) == ADMITTED and status_writes(api) == 2
    assert len(agents.leases) == 1 and controller.counters.answers_written == 1


async def test_an_agent_that_cannot_be_reached_keeps_its_claims_owed_and_unanswered(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    """Never a refusal written by the controller itself: the claim waits (the scheduler's
    binding timeout is its bound), asked again with backoff, until the agent answers."""
    agents = Agents(down={NODE})
    async with controlling(kube, agents) as controller:
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: len(agents.asks) >= 4)
        assert status_writes(api) == 0 and not conditions(api)
        assert controller.owing == 1 and controller.counters.unreached >= 4
        agents.down.clear()  # the agent is back
        await until(lambda: bool(conditions(api)), timeout_s=3.0)
        await until(lambda: not controller.owing)
    assert conditions(api) == ADMITTED and status_writes(api) == 1


async def test_a_claim_on_two_nodes_gets_each_nodes_answer_and_waits_for_the_one_down(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = Agents(down={"node-b"})
    async with controlling(kube, agents) as controller:
        api.put_object("resourceclaims", claim_on("c", [("node-a", "gpu-0"), ("node-b", "gpu-1")]))
        await until(lambda: len(conditions(api)) == 1)
        assert controller.owing == 1  # node-b's share still waits
        agents.down.clear()
        await until(lambda: len(conditions(api)) == 2, timeout_s=3.0)
        await until(lambda: not controller.owing)
    assert sorted(conditions(api)) == [
        ("gpu-0", ADMITTED_TYPE, "Admitted"),
        ("gpu-1", ADMITTED_TYPE, "Admitted"),
    ]
    assert status_writes(api) == 2


async def test_claims_that_wait_for_nothing_here_are_not_asked_about(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = Agents()
    async with controlling(kube, agents) as controller:
        await until(lambda: api.requests["watch"] >= 1)  # listed: the claims come as changes
        api.put_object("resourceclaims", claim("other", "gpu-0", driver="other.io"))
        api.put_object("resourceclaims", claim("plain", "gpu-0", binding=False))
        unallocated = claim("pending", "gpu-0")
        unallocated["status"] = {}
        api.put_object("resourceclaims", unallocated)
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: bool(conditions(api)))
        await until(lambda: not controller.owing)
        await asyncio.sleep(0.2)
    assert agents.asks == [(NODE, "c")]
    assert status_writes(api, "/resourceclaims/c/status") == 1
    # the other driver's claim was never decoded: its events passed as bookmarks
    assert controller.counters.events_skipped >= 1


def deleted(api: FakeApiServer) -> None:
    api.delete_object("resourceclaims", "ns", "c")


def deallocated(api: FakeApiServer) -> None:
    """The scheduler's binding timeout: it takes the allocation back."""
    changed = stored(api)
    assert changed is not None
    changed["status"] = {}
    api.put_object("resourceclaims", changed)


def replaced(api: FakeApiServer) -> None:
    """Deleted, and another claim of its name made (another UID), not allocated."""
    deleted(api)
    other = claim("c", "gpu-0")
    other["status"] = {}
    api.put_object("resourceclaims", other)


@pytest.mark.parametrize("goes", [deleted, deallocated, replaced])
async def test_an_answer_whose_write_keeps_failing_is_owed_until_its_claim_goes(
    api: FakeApiServer, kube: RestKubeApi, goes: Callable[[FakeApiServer], None]
) -> None:
    agents = Agents()
    api.fail_next("PUT", STATUS, 503, times=FOREVER)
    async with controlling(kube, agents) as controller:
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: status_writes(api) >= 7)
        goes(api)
        await until(lambda: not controller.owing, timeout_s=3.0)
        writes, asks = status_writes(api), len(agents.asks)
        await asyncio.sleep(0.5)
        assert status_writes(api) == writes and len(agents.asks) == asks  # no longer tried
        assert not tasks_of("c")


async def test_a_relist_starts_no_second_task_for_an_owed_claim(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = Agents()
    api.fail_next("PUT", STATUS, 503, times=FOREVER)
    async with controlling(kube, agents, backoff_s=0.5) as controller:
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: status_writes(api) >= 1)
        lists = api.requests["list"]
        api.end_watches()  # the watch ends, a change comes, and the server forgets it
        api.put_object("resourceclaims", claim("elsewhere", "gpu-0", node="node-b"))
        api.compact()
        await until(lambda: api.requests["list"] > lists)
        await asyncio.sleep(0.1)  # the relisted claim is considered
        assert len(tasks_of("c")) == 1 and controller.owing == 1
        assert controller.counters.relists >= 2


async def test_a_watch_that_times_out_resumes_without_a_relist(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = Agents()
    async with controlling(kube, agents) as controller:
        await until(lambda: api.requests["watch"] >= 1)
        api.end_watches()  # the server's timeoutSeconds
        await until(lambda: api.requests["watch"] >= 2)
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: bool(conditions(api)))
    assert api.requests["list"] == 1 and controller.counters.relists == 1


async def test_counters_say_what_was_decoded_and_written(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = Agents(full={"gpu-1"})
    async with controlling(kube, agents, measure_bytes=True) as controller:
        api.put_object("resourceclaims", claim("a", "gpu-0"))
        api.put_object("resourceclaims", claim("b", "gpu-1"))
        await until(lambda: controller.counters.answers_written == 2 and not controller.owing)
    counters = controller.counters
    assert counters.refusals_written == 1 and counters.asks == 2
    assert counters.claims_seen >= 2 and counters.bytes_decoded > 500
