"""Leader election (agent/kubeapi/leader.py) against the stand-in API server's Leases, through
the real adapter: who takes the Lease when, a write race decided by resourceVersion, the
work stopped when renewals fail or another holder shows, the Lease released on a stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.kubeapi.leader import LeaderElector, LeaderOptions, Record, verdict
from agent.kubeapi.rest import RestKubeApi
from tests.kubeworld.apiserver import FakeApiServer

LEASE_PATH = r"^/apis/coordination.k8s.io/v1/namespaces/gpushare-system/leases/gpushare-kube-serve$"
FAST = LeaderOptions(lease_duration_s=0.6, renew_deadline_s=0.4, retry_period_s=0.05)


def record(holder: str, duration_s: float = 15.0) -> Record:
    return Record(holder=holder, duration_s=duration_s, transitions=0, version="7")


@pytest.mark.parametrize(
    ("lease", "unchanged_for_s", "expected"),
    [
        (None, 0.0, "create"),  # nobody has made it yet
        (record("me"), 0.0, "renew"),
        (record("me"), 99.0, "renew"),  # mine, however long since
        (record(""), 0.0, "take"),  # released by its last holder
        (record("other"), 14.9, "wait"),  # held, renewed lately as far as we saw
        (record("other"), 15.0, "take"),  # unchanged for its whole duration
        (record("other", duration_s=60.0), 30.0, "wait"),  # the holder's duration counts
    ],
)
def test_the_verdict(lease: Record | None, unchanged_for_s: float, expected: str) -> None:
    assert verdict(lease, "me", unchanged_for_s=unchanged_for_s) == expected


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, RestKubeApi]]:
    async with FakeApiServer() as server:
        kube = RestKubeApi.from_url(server.url)
        try:
            yield server, kube
        finally:
            await kube.aclose()


def holder(server: FakeApiServer) -> dict[str, object]:
    stored = server.objects["leases"][("gpushare-system", "gpushare-kube-serve")]
    return dict(stored["spec"])


async def test_a_held_lease_is_taken_only_after_it_stayed_unchanged_for_its_duration(
    api: tuple[FakeApiServer, RestKubeApi],
) -> None:
    server, kube = api
    first_clock, second_clock = Clock(), Clock()
    first = LeaderElector(kube, LeaderOptions(identity="a"), clock=first_clock)
    second = LeaderElector(kube, LeaderOptions(identity="b"), clock=second_clock)
    assert await first.try_once()  # created
    spec = holder(server)
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15 and spec["leaseTransitions"] == 0
    assert str(spec["renewTime"]).endswith("Z") and "." in str(spec["renewTime"])

    assert not await second.try_once()  # first sight of a's record
    second_clock.now += 14.0
    assert not await second.try_once()
    first_clock.now += 14.0
    assert await first.try_once()  # a renews: a new version, seen by b as new
    second_clock.now += 14.0
    assert not await second.try_once()  # 28 s since b began watching, 14 since the change
    second_clock.now += 15.0  # a stopped renewing
    assert await second.try_once()
    assert holder(server)["holderIdentity"] == "b"
    assert holder(server)["leaseTransitions"] == 1
    assert not await first.try_once()  # a sees b's fresh record: it waits


async def test_two_candidates_writing_at_once_one_wins(
    api: tuple[FakeApiServer, RestKubeApi],
) -> None:
    server, kube = api
    a = LeaderElector(kube, LeaderOptions(identity="a"))
    b = LeaderElector(kube, LeaderOptions(identity="b"))
    won = await asyncio.gather(a.try_once(), b.try_once())
    assert sorted(won) == [False, True]  # the create of one is a 409 for the other
    assert holder(server)["holderIdentity"] == ("a" if won[0] else "b")


async def test_work_runs_while_leading_and_a_stop_releases_the_lease(
    api: tuple[FakeApiServer, RestKubeApi],
) -> None:
    server, kube = api
    a = LeaderElector(kube, LeaderOptions(identity="a", **_fast()))
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.Event().wait()

    running = asyncio.create_task(a.run(work))
    await asyncio.wait_for(started.wait(), 5)
    assert a.leading
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert holder(server)["holderIdentity"] == ""  # released: the next takes it at once
    b = LeaderElector(kube, LeaderOptions(identity="b", **_fast()))
    assert await b.try_once()


class Leading:
    """``elector.run`` with a work that says when it started and when it stopped."""

    def __init__(self, elector: LeaderElector) -> None:
        self.started, self.stopped = asyncio.Event(), asyncio.Event()
        self.task = asyncio.create_task(elector.run(self._work))

    async def _work(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.stopped.set()

    async def end(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_the_work_stops_when_renewals_fail_past_the_deadline(
    api: tuple[FakeApiServer, RestKubeApi],
) -> None:
    """The API server refuses every renewal: the leader's work is cancelled within the
    renew deadline, before another replica could take over (the lease duration)."""
    server, kube = api
    a = LeaderElector(kube, LeaderOptions(identity="a", **_fast()))
    leading = Leading(a)
    try:
        await asyncio.wait_for(leading.started.wait(), 5)
        server.fail_next("PUT", LEASE_PATH, 500, times=1000)
        loop = asyncio.get_running_loop()
        failing_since = loop.time()
        await asyncio.wait_for(leading.stopped.wait(), 5)
        assert loop.time() - failing_since < FAST.lease_duration_s
        assert not a.leading
    finally:
        await leading.end()


async def test_the_work_stops_when_another_holder_shows(
    api: tuple[FakeApiServer, RestKubeApi],
) -> None:
    server, kube = api
    leading = Leading(LeaderElector(kube, LeaderOptions(identity="a", **_fast())))
    try:
        await asyncio.wait_for(leading.started.wait(), 5)
        stored = server.objects["leases"][("gpushare-system", "gpushare-kube-serve")]
        taken = {**stored, "spec": {**stored["spec"], "holderIdentity": "b"}}  # as b would
        await kube.replace_lease("gpushare-system", "gpushare-kube-serve", taken)
        await asyncio.wait_for(leading.stopped.wait(), 5)
    finally:
        await leading.end()
    assert holder(server)["holderIdentity"] == "b"  # not written back, not released


async def test_the_work_failing_is_raised_after_the_lease_is_released(
    api: tuple[FakeApiServer, RestKubeApi],
) -> None:
    server, kube = api
    a = LeaderElector(kube, LeaderOptions(identity="a", **_fast()))

    async def work() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        await asyncio.wait_for(a.run(work), 5)
    assert holder(server)["holderIdentity"] == ""


def test_timings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaderOptions(lease_duration_s=10, renew_deadline_s=10, retry_period_s=2)


def _fast() -> dict[str, float]:
    return {
        "lease_duration_s": FAST.lease_duration_s,
        "renew_deadline_s": FAST.renew_deadline_s,
        "retry_period_s": FAST.retry_period_s,
    }


async def test_a_renewal_keeps_the_lease_object_and_a_new_holder_counts_a_transition(
    api: tuple[FakeApiServer, RestKubeApi],
) -> None:
    server, kube = api
    a = LeaderElector(kube, LeaderOptions(identity="a", lease_duration_s=10.4))
    assert await a.try_once()
    stored = server.objects["leases"][("gpushare-system", "gpushare-kube-serve")]
    stored["metadata"]["labels"] = {"team": "platform"}  # set by someone else
    assert await a.try_once()
    assert stored is not server.objects["leases"][("gpushare-system", "gpushare-kube-serve")]
    renewed = server.objects["leases"][("gpushare-system", "gpushare-kube-serve")]
    assert renewed["metadata"]["labels"] == {"team": "platform"}
    assert renewed["spec"]["leaseDurationSeconds"] == 11  # rounded up: never shorter
    assert renewed["spec"]["leaseTransitions"] == 0
    await a._release()
    b = LeaderElector(kube, LeaderOptions(identity="b"))
    assert await b.try_once()  # a released Lease: taken at once, a new holder
    assert holder(server)["leaseTransitions"] == 1


async def test_why_the_lease_cannot_be_taken_is_logged_once(
    api: tuple[FakeApiServer, RestKubeApi], caplog: pytest.LogCaptureFixture
) -> None:
    server, kube = api
    server.fail_next("GET", LEASE_PATH, 403, message="leases is forbidden", times=1000)
    a = LeaderElector(kube, LeaderOptions(identity="a", **_fast()))
    trying = asyncio.create_task(a.run(asyncio.Event().wait))
    await asyncio.sleep(0.5)  # several tries
    trying.cancel()
    await asyncio.gather(trying, return_exceptions=True)
    said = [r.getMessage() for r in caplog.records if "cannot take the Lease" in r.getMessage()]
    assert len(said) == 1 and "forbidden" in said[0], said


# -- explored: three candidates, any order of reads, writes, stops and waits ---------------

Step = tuple[str, int, float]  # ("try" | "release" | "wait", candidate, seconds)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("try"), st.integers(0, 2), st.just(0.0)),
        st.tuples(st.just("release"), st.integers(0, 2), st.just(0.0)),
        st.tuples(st.just("wait"), st.just(0), st.floats(0.0, 20.0)),
    ),
    max_size=40,
)


async def explore(steps: list[Step]) -> None:
    """The protocol's promise, checked after every step: a candidate takes a Lease held by
    another only once that holder's last write is at least the duration old (so a holder
    that stops at its renew deadline, shorter, never overlaps the next); a candidate
    told it holds the Lease is its holder in the store; a stopped holder's Lease is free."""
    now = [0.0]
    async with FakeApiServer() as server:
        kube = RestKubeApi.from_url(server.url)
        try:
            electors = [
                LeaderElector(kube, LeaderOptions(identity=f"c{i}"), clock=lambda: now[0])
                for i in range(3)
            ]
            last_write: dict[str, float] = {}  # holder -> when its last write went
            for action, index, seconds in steps:
                me = electors[index]
                before = _holder_or_none(server)
                if action == "wait":
                    now[0] += seconds
                elif action == "release":
                    await me._release()
                    if before == me.identity:
                        assert _holder_or_none(server) == ""
                        last_write.pop(me.identity, None)
                elif await me.try_once():
                    assert _holder_or_none(server) == me.identity
                    if before not in (None, "", me.identity):
                        held_for = now[0] - last_write[before]
                        assert held_for >= 15.0, f"{me.identity} took {before}'s after {held_for}"
                    last_write[me.identity] = now[0]
                else:
                    assert _holder_or_none(server) != me.identity or before != me.identity
        finally:
            await kube.aclose()


def _holder_or_none(server: FakeApiServer) -> str | None:
    stored = server.objects["leases"].get(("gpushare-system", "gpushare-kube-serve"))
    return None if stored is None else str(stored["spec"].get("holderIdentity") or "")


@settings(max_examples=40, deadline=None)
@given(STEPS)
def test_no_candidate_takes_a_lease_its_holder_may_still_use(steps: list[Step]) -> None:
    asyncio.run(explore(steps))
