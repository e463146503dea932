"""A caller that goes away at any ``await`` (the binding controller's AnswerClaim deadline,
a kubelet's Prepare or Unprepare deadline, the agent stopping its claim reconcile) never
leaves a claim half done: the work runs to its end, and the next ask finds what it did.

Explored, not sampled: each operation is started on a fresh claim and cancelled after 0, 1,
2, ... steps of the event loop, until a call ends before its cancellation; after each, the
work left running is awaited and the node's word checked against what a caller that
waited would have seen. The agent runs in this event loop as the node's DRA driver, with
its real ledger (SQLite) and its real spec and index files, against the API stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent.aio import section
from agent.claims.binding import decide
from agent.dra.port import ClaimRef
from agent.runtime.app import App
from tests.dra.fixtures import NODE, claim_user_pod, reserve
from tests.dra.test_answer_claim import claim as waiting_claim
from tests.dra.test_answer_claim import result as waiting_result
from tests.dra.test_claim_answers import allocated_claim, result
from tests.dra.test_reconcile_node import claim_uids, parts, prepared, uid_of
from tests.helpers import fake_ports, running_app, sim_settings
from tests.kubeworld.apiserver import FakeApiServer

pytestmark = pytest.mark.timeout(240)
MOST_STEPS = 400  # a call longer than this many loop steps fails the exploration


@pytest.fixture
async def app(root: Path, driver_settings: dict[str, object]) -> AsyncIterator[App]:
    settings = sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            **driver_settings,
            "dra.reconcile_interval_s": 3600,  # its passes are the test's
        },
    )
    async with running_app(settings, fake_ports(2)) as running_agent:
        yield running_agent


async def cancelled_after(steps: int, call: Callable[[], Awaitable[Any]]) -> bool:
    """Run ``call``, cancel it after ``steps`` loop steps, then wait for the work it left
    running; True when it ended before it could be cancelled."""
    task = asyncio.ensure_future(call())
    for _ in range(steps):
        if task.done():
            break
        await asyncio.sleep(0)
    ended = task.done()
    task.cancel()
    outcome = (await asyncio.gather(task, return_exceptions=True))[0]
    if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
        raise outcome
    await settled()
    return ended


async def settled() -> None:
    """Until no critical section left running by a cancelled caller is still at work."""
    while section._running:
        await asyncio.gather(*list(section._running), return_exceptions=True)


async def explore(check: Callable[[int], Awaitable[bool]]) -> int:
    """``check(steps)`` for 0, 1, 2, ... steps until a call ends uncancelled; the count."""
    for steps in range(MOST_STEPS):
        if await check(steps):
            return steps
    raise AssertionError(f"no call ended within {MOST_STEPS} loop steps")


def reserved(api: FakeApiServer, claim: dict[str, Any]) -> dict[str, Any]:
    """``claim`` reserved for a pod of UID 1000 (its read is one more await to cut)."""
    return reserve(claim, claim_user_pod(api, claim, f"{claim['metadata']['name']}-pod"))


async def test_a_binding_answer_cancelled_at_any_await_is_found_whole_by_the_next_ask(
    app: App, api: FakeApiServer
) -> None:
    driver, _ = parts(app)

    async def check(steps: int) -> bool:
        claim = reserved(api, waiting_claim(waiting_result("gpu-0")))
        uid = uid_of(claim)
        ended = await cancelled_after(steps, lambda: decide(driver, claim))
        leases = [x for x in driver.live_leases() if uid in x.request_id]
        assert len(leases) <= 1, f"step {steps}: {len(leases)} leases for one share"
        assert driver.specs.index.get(uid) is not None or not leases, f"step {steps}"
        [answer] = await decide(driver, claim)  # asked again: the word of the whole work
        assert answer.admitted, (steps, answer)
        again = [x.lease_id for x in driver.live_leases() if uid in x.request_id]
        assert again == [x.lease_id for x in leases] or not leases, f"step {steps}"
        assert len(again) == 1
        assert [x.run_as_uid for x in driver.live_leases() if uid in x.request_id] == [1000]
        await driver.leases.release_claim(uid, "the test's next step")
        return ended

    steps = await explore(check)
    assert steps > 3  # the answer awaited something: the exploration cut it somewhere


async def test_a_prepare_or_unprepare_cancelled_at_any_await_leaves_the_claim_whole(
    app: App, api: FakeApiServer
) -> None:
    driver, _ = parts(app)

    async def check_prepare(steps: int) -> bool:
        claim = reserved(api, allocated_claim(NODE, [result(NODE)]))
        stored = api.put_object("resourceclaims", claim)
        ref = ClaimRef("default", stored["metadata"]["name"], uid_of(stored))
        ended = await cancelled_after(steps, lambda: driver.prepare([ref]))
        held = uid_of(stored) in claim_uids(driver)
        # whatever was done: a lease is in its spec, a spec has its lease
        assert held == (uid_of(stored) in driver.specs.claims()), f"step {steps}"
        answer = await driver.prepare([ref])  # the kubelet tries again
        assert not answer[ref.uid].error, (steps, answer)
        assert uid_of(stored) in driver.specs.claims()
        await driver.unprepare([ref])
        return ended

    async def check_unprepare(steps: int) -> bool:
        stored = await prepared(api, driver, allocated_claim(NODE, [result(NODE)]))
        ref = ClaimRef("default", stored["metadata"]["name"], uid_of(stored))
        ended = await cancelled_after(steps, lambda: driver.unprepare([ref]))
        assert (await driver.unprepare([ref]))[ref.uid] == "", f"step {steps}"
        assert uid_of(stored) not in claim_uids(driver), f"step {steps}"
        assert uid_of(stored) not in driver.specs.claims(), f"step {steps}"
        assert driver.specs.index.get(ref.uid) is None, f"step {steps}"
        return ended

    assert await explore(check_prepare) > 3
    assert await explore(check_unprepare) > 1


async def test_a_reconcile_pass_cancelled_at_any_await_releases_once_and_the_next_finishes(
    app: App, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release by a pass cancelled after it began is counted and told (the event that
    explains it) by that pass's own work, once."""
    driver, reconciler = parts(app)
    told: list[str] = []  # the claims whose release the agent explained (dra.claim_gone)
    note = driver.note
    monkeypatch.setattr(
        driver,
        "note",
        lambda kind, message, claim, **attrs: (
            told.append(claim["metadata"]["uid"]) if kind == "dra.claim_gone" else None,
            note(kind, message, claim, **attrs),
        ),
    )

    async def check(steps: int) -> bool:
        claim = await prepared(api, driver, allocated_claim(NODE, [result(NODE)]))
        api.delete_object("resourceclaims", "default", claim["metadata"]["name"])
        await asyncio.sleep(0.02)  # the lease is older than the pass
        before = reconciler.released
        ended = await cancelled_after(steps, reconciler.once)
        assert reconciler.released - before <= 1, f"step {steps}"
        await reconciler.once()  # the next pass finishes what is left
        assert reconciler.released - before == 1, f"step {steps}: released twice or never"
        assert uid_of(claim) not in claim_uids(driver), f"step {steps}"
        assert uid_of(claim) not in driver.specs.claims(), f"step {steps}"
        assert driver.specs.index.get(uid_of(claim)) is None, f"step {steps}"
        assert told.count(uid_of(claim)) == 1, f"step {steps}: the release told {told}"
        return ended

    assert await explore(check) > 1
