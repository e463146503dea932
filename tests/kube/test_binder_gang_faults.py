"""A gang, and a bind, through the faults the binder cannot prevent, against the stand-in
API server and real agents: a Commit whose answer is lost, ``kube serve`` stopped in the
middle of a commit, a member bound again by a ``kube serve`` started afresh, and an agent
link closed under a bind that waits in its line. Each left a gang bound in part, or
answered HTTP 500, before it was mended."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.legacy.cluster.binder import Binder, BindOptions
from tests.kube.binder_world import BINDING, NS, World, world

pytestmark = pytest.mark.timeout(90)


def bound_gang(w: World, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if w.placement(n)[0]]


async def test_a_commit_whose_answer_is_lost_leaves_no_member_committed(root: Path) -> None:
    """n2's Commit lands but its answer is lost: the gang fails, and the members of every
    node the commit was sent to are released, so no retry binds one alone."""
    async with world(root, nodes=("n1", "n2"), hold_s=0.5, gang_ttl_s=3.0) as w:
        for name in ("g0", "g1"):
            w.create(name, gang="g", size=2)
        link: Any = w.cache.link("n2")
        commit = link.commit

        async def commit_then_lose_the_answer(gang_id: str) -> Any:
            await commit(gang_id)
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                "connection reset after the commit",
                None,
            )

        link.commit = commit_then_lose_the_answer
        first = await asyncio.gather(w.bind("g0", "n1"), w.bind("g1", "n2"))
        assert all(why for _status, why in first), first
        link.commit = commit
        assert [x.state for _node, x in (await w.leases()).values()] == []
        await w.bind("g1", "n2")  # a retry alone: reserved, then aborted at the gang's TTL
        assert bound_gang(w, ("g0", "g1")) == []


async def test_a_stop_in_the_middle_of_a_commit_leaves_no_member_committed(root: Path) -> None:
    """``kube serve`` stops while n2's commit is slow: the commits already sent end as one
    unit, then, n2's succeeding, the gang is committed whole; a new ``kube serve`` binds
    each member with its committed lease."""
    async with world(root, nodes=("n1", "n2"), hold_s=0.5, gang_ttl_s=3.0) as w:
        for name in ("g0", "g1"):
            w.create(name, gang="g", size=2)
        link: Any = w.cache.link("n2")
        commit = link.commit
        reached = asyncio.Event()

        async def slow_commit(gang_id: str) -> Any:
            reached.set()
            await asyncio.sleep(1.0)  # a slow disk on n2
            return await commit(gang_id)

        link.commit = slow_commit
        uids = {n: w.pod(n)["metadata"]["uid"] for n in ("g0", "g1")}
        binds = [
            asyncio.ensure_future(w.binder.bind(NS, n, uids[n], f"n{i + 1}"))
            for i, n in enumerate(("g0", "g1"))
        ]
        await reached.wait()
        await w.binder.aclose()  # kube serve stops (a rollout)
        await asyncio.gather(*binds, return_exceptions=True)
        link.commit = commit
        states = sorted(x.state for _node, x in (await w.leases()).values())
        assert states in ([], ["admitted", "admitted"]), states  # all or nothing
        afresh = Binder(w.kube, w.cache, BindOptions(hold_s=0.5, gang_ttl_s=3.0))
        try:
            answers = await asyncio.gather(
                *(afresh.bind(NS, n, uids[n], f"n{i + 1}") for i, n in enumerate(("g0", "g1")))
            )
        finally:
            await afresh.aclose()
        assert answers == ["", ""], answers
        assert bound_gang(w, ("g0", "g1")) == ["g0", "g1"]


async def test_a_member_bound_again_by_a_new_kube_serve_is_bound(root: Path) -> None:
    """g0's Binding failed after its gang's commit (nothing landed: its lease given back).
    The binder that knew the gang committed is gone; the new one sees the gang's committed
    leases on the agents and commits g0's new reservation alone, in its turn."""
    async with world(root, gang_ttl_s=2.0) as w:
        for name in ("g0", "g1"):
            w.create(name, gang="g", size=2)
        w.server.fail_next("POST", BINDING.format(name="g0"), 422)  # refused: not bound
        first = await asyncio.gather(w.bind("g0", "n1"), w.bind("g1", "n1"))
        assert first[1] == (200, "") and first[0][1], first
        await asyncio.sleep(0.2)  # the cache hears of the commit
        afresh = Binder(w.kube, w.cache, BindOptions(hold_s=0.5, gang_ttl_s=2.0))
        try:
            uid = w.pod("g0")["metadata"]["uid"]
            assert await asyncio.wait_for(afresh.bind(NS, "g0", uid, "n1"), 10) == ""
        finally:
            await afresh.aclose()
        assert bound_gang(w, ("g0", "g1")) == ["g0", "g1"]


async def test_a_bind_holding_a_link_closed_under_it_fails_cleanly(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """b waits in its line with the agent's link in hand; the agent moves (a new address
    in its EndpointSlice) and the cache closes that link: b's call on it is a failed
    call, answered as such, never an HTTP 500 with a traceback."""
    caplog.set_level(logging.INFO)
    async with world(root, hold_s=1.5) as w:
        w.create("a")
        w.create("b")
        assert await w.bind("a", "n1") == (200, "")  # bound, never allocated: b waits
        b = asyncio.ensure_future(w.bind("b", "n1"))
        await asyncio.sleep(0.3)
        w.cache.set_targets({"n1": f"localhost:{w.apps['n1'].tcp_port}"})
        status, why = await b
        assert status == 200, (status, why)
        assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
