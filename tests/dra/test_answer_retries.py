"""Binding answers that cannot be written at once (issue 37, observation 8): the answer
stays owed, tried again with a capped backoff, each try reading the claim first, until
the claim is answered or gone; whatever the status write's outcome, a share is answered
once, an admission keeps its lease until its claim is gone, a refusal keeps none, and a
relist starts no second task for a claim that is owed already."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.kubeapi.rest import RestKubeApi
from agent.runtime.draanswers import BindingAnswers
from tests.dra import test_binding_answers as binding_answers
from tests.dra.test_binding_answers import FakeDriver, claim, conditions, until
from tests.kube.apiserver import FakeApiServer

STATUS = r"/namespaces/ns/resourceclaims/c/status"
ADMITTED = [("gpu-0", "gpushare.io/admitted", "Admitted")]
REFUSED = [("gpu-0", "gpushare.io/refused", "NO_MEMORY")]
FOREVER = 10**6  # a fault's count that outlasts any test: removed to end the outage

Fault = Callable[[FakeApiServer], Awaitable[None]]


@pytest.fixture
def kube_timeout_s() -> float:
    return 1.0  # a status write with no answer is given up within a test's time


def answering(
    kube: RestKubeApi, driver: FakeDriver, *, backoff_s: float = 0.05
) -> contextlib.AbstractAsyncContextManager[BindingAnswers]:
    return binding_answers.answering(kube, driver, backoff_s=backoff_s, backoff_max_s=0.2)


def status_writes(api: FakeApiServer) -> int:
    return sum(1 for method, path, _ in api.log if method == "PUT" and path.endswith(STATUS))


def stored(api: FakeApiServer, name: str = "c") -> dict[str, Any] | None:
    found = [x for x in api.objects("resourceclaims") if x["metadata"]["name"] == name]
    return found[0] if found else None


def expire_the_watch(api: FakeApiServer) -> None:
    """The watch ends, a change comes before it is back (another node's claim), and the
    server forgets it (compaction): the watch comes back from a version the server no
    longer has (410 Gone), and the claims are listed again."""
    api.end_watches()
    other = claim("elsewhere", "gpu-0")
    other["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    api.put_object("resourceclaims", other)
    api.compact()


def tasks_of(name: str) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"binding-ns/{name}"]


# -- the status write's outcomes --------------------------------------------------------


def injected(status: int, times: int = 1, **how: Any) -> Fault:
    async def fault(api: FakeApiServer) -> None:
        api.fail_next("PUT", STATUS, status, times=times, **how)

    return fault


def meanwhile(change: Callable[[FakeApiServer], object]) -> Fault:
    """The claim changes between the agent's read and its write (the write is held)."""

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
    leases: int
    full: set[str] = field(default_factory=set)


ROWS = {
    "done": Row(None, 1, ADMITTED, 1),
    # RBAC or validation: logged, tried again with backoff until it is fixed
    "refused by the API, then allowed": Row(injected(403, 6, reason="Forbidden"), 7, ADMITTED, 1),
    "failed, not done": Row(injected(503, 6), 7, ADMITTED, 1),
    "failed but done": Row(injected(500, landed=True), 1, ADMITTED, 1),  # read again: no 2nd
    "timed out, done": Row(injected(0, hang=True, landed=True), 1, ADMITTED, 1),
    "timed out, not done": Row(injected(0, hang=True), 2, ADMITTED, 1),
    "conflict: changed meanwhile": Row(meanwhile(relabelled), 2, ADMITTED, 1),
    "not found: deleted meanwhile": Row(
        meanwhile(lambda api: api.delete_object("resourceclaims", "ns", "c")), 1, None, 0
    ),
    "a refusal whose write keeps failing": Row(injected(503, 6), 7, REFUSED, 0, {"gpu-0"}),
}  # fmt: skip


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
async def test_each_outcome_of_the_status_write(
    api: FakeApiServer, kube: RestKubeApi, row: Row
) -> None:
    driver = FakeDriver(full=row.full)
    async with answering(kube, driver) as answers, asyncio.TaskGroup() as faults:
        if row.fault is not None:
            faults.create_task(row.fault(api))
            await asyncio.sleep(0)  # the fault is in place before the claim comes
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        settled = (lambda: stored(api) is None) if row.answer is None else None
        await until(settled or (lambda: bool(conditions(api, "c"))))
        await until(lambda: len(driver.node.leases) == row.leases and not answers.owing)
        await asyncio.sleep(0.3)  # nothing more comes
    assert status_writes(api) == row.writes
    assert (conditions(api, "c") if stored(api) else None) == row.answer
    assert len(driver.node.leases) == row.leases
    assert len(driver.admitted) == (0 if row.full else 1)  # admitted once, if at all


# -- owed through an outage -------------------------------------------------------------


async def test_an_answer_owed_through_an_outage_is_written_once_the_api_recovers(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    """Status writes fail with 503 for longer than any fixed number of tries, and the
    watch ends meanwhile: once the writes go through again the claim is answered."""
    driver = FakeDriver(full=set())
    outage = api.fail_next("PUT", STATUS, 503, times=FOREVER)
    async with answering(kube, driver) as answers:
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: status_writes(api) >= 8)
        assert len(driver.node.leases) == 1 and answers.owing == 1  # held, still owed
        api.end_watches()
        api.faults.remove(outage)  # the API server recovers
        await until(lambda: bool(conditions(api, "c")), timeout_s=3.0)
        await until(lambda: not answers.owing)
    assert conditions(api, "c") == ADMITTED
    assert len(driver.node.leases) == 1 and answers.answered == 1


def deleted(api: FakeApiServer) -> None:
    api.delete_object("resourceclaims", "ns", "c")


def deallocated(api: FakeApiServer) -> None:
    """The scheduler's binding timeout: it takes the allocation back."""
    changed = stored(api)
    assert changed is not None
    changed["status"] = {}
    api.put_object("resourceclaims", changed)


def replaced(api: FakeApiServer) -> None:
    """Deleted, and another claim of its name made (another UID), not for this node."""
    deleted(api)
    other = claim("c", "gpu-0")
    other["status"] = {}
    api.put_object("resourceclaims", other)


@pytest.mark.parametrize("goes", [deleted, deallocated, replaced])
async def test_an_admission_whose_write_keeps_failing_keeps_its_lease_until_its_claim_goes(
    api: FakeApiServer, kube: RestKubeApi, goes: Callable[[FakeApiServer], None]
) -> None:
    driver = FakeDriver(full=set())
    api.fail_next("PUT", STATUS, 503, times=FOREVER)
    async with answering(kube, driver) as answers:
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: status_writes(api) >= 7)
        assert len(driver.node.leases) == 1  # the scheduler still waits for it
        goes(api)
        await until(lambda: not driver.node.leases and not answers.owing, timeout_s=3.0)
        writes = status_writes(api)
        await asyncio.sleep(0.5)
        assert status_writes(api) == writes  # no longer tried
        assert not tasks_of("c")


async def test_a_relist_starts_no_second_task_for_an_owed_claim(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    driver = FakeDriver(full=set())
    api.fail_next("PUT", STATUS, 503, times=FOREVER)
    async with answering(kube, driver, backoff_s=0.5) as answers:
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: status_writes(api) >= 1)
        lists = api.requests["list"]
        expire_the_watch(api)
        await until(lambda: api.requests["list"] > lists)
        await asyncio.sleep(0.1)  # the relisted claim is considered
        assert len(tasks_of("c")) == 1 and answers.owing == 1
        assert len(driver.node.leases) == 1
