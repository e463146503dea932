"""A gang member's Binding answered badly (refused after the commit, its outcome unknown,
sent twice, the commit failed on another node), against real agents and the stand-in API
server: no member is left bound alone, no lease left to another pod."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.legacy.cluster.binder import Binder, BindOptions
from tests.kube.binder_world import BINDING, NS, POD, world

pytestmark = pytest.mark.timeout(120)


async def test_a_gang_member_whose_binding_failed_after_the_commit_is_bound_on_its_retry(
    root: Path,
) -> None:
    """Observation: every retry raised KeyError (HTTP 500) and reserved again, in a loop."""
    async with world(root) as w:
        for name in ("g0", "g1"):
            w.create(name, gang="g", size=2)
        w.server.fail_next("POST", BINDING.format(name="g0"), 422)  # refused: not landed
        first = await asyncio.gather(w.bind("g0", "n1"), w.bind("g1", "n1"))
        assert first[1] == (200, "")
        assert first[0][0] == 200 and "422" in first[0][1]

        assert await w.bind("g0", "n1") == (200, "")  # the scheduler's retry
        leases = {x.pod: x for _, x in (await w.leases()).values()}
        assert sorted(leases) == [f"{NS}/g0", f"{NS}/g1"]
        for name in ("g0", "g1"):
            assert w.placement(name) == ("n1", leases[f"{NS}/{name}"].lease_id)
            assert leases[f"{NS}/{name}"].state == "admitted"  # none left reserved


@pytest.mark.parametrize("retried_by", ["the same binder", "a binder started afresh"])
async def test_a_gang_member_whose_binding_outcome_was_unknown_binds_its_committed_lease(
    root: Path, retried_by: str
) -> None:
    """Its lease kept (the pod could not be read back), the retry gets the committed
    lease back from the agent (Reserve, same request id) and binds it, also when the
    binder that committed the gang is gone (``kube serve`` restarted)."""
    async with world(root) as w:
        for name in ("g0", "g1"):
            w.create(name, gang="g", size=2)
        w.server.fail_next("POST", BINDING.format(name="g0"), 500, times=1000)
        w.server.fail_next("GET", POD.format(name="g0"), 503, times=1000)
        first = await asyncio.gather(w.bind("g0", "n1"), w.bind("g1", "n1"))
        assert first[1] == (200, "") and "kept" in first[0][1]
        [(_, kept)] = await w.leases_of("g0")
        assert kept.state == "admitted"
        w.server.faults.clear()

        if retried_by == "the same binder":
            assert await w.bind("g0", "n1") == (200, "")
        else:
            afresh = Binder(w.kube, w.cache, BindOptions(hold_s=0.5))
            uid = w.pod("g0")["metadata"]["uid"]
            assert await afresh.bind(NS, "g0", uid, "n1") == ""
        assert w.placement("g0") == ("n1", kept.lease_id)
        assert len(await w.leases()) == 2


async def test_a_gang_member_bound_twice_leaves_no_lease_to_another_member(root: Path) -> None:
    """Observation: one of the two binds of g0 answered 500 and its lease, committed with
    the gang, was left on n1 for the next pod bound there (g1) to be handed at Allocate."""
    async with world(root, nodes=("n1", "n2"), hold_s=0.3) as w:
        for name in ("g0", "g1"):
            w.create(name, gang="g", size=2)
        first = asyncio.ensure_future(w.bind("g0", "n1"))
        async with asyncio.timeout(10):
            while not await w.leases_of("g0"):  # reserved on n1, waiting for its gang
                await asyncio.sleep(0.02)
        again = asyncio.ensure_future(w.bind("g0", "n2"))  # its answer lost: sent again
        await asyncio.sleep(0.3)
        last = asyncio.ensure_future(w.bind("g1", "n1"))
        answers = await asyncio.gather(first, again, last)

        assert [status for status, _ in answers] == [200, 200, 200], answers
        bound = {name: w.placement(name) for name in ("g0", "g1")}
        assert answers[2] == (200, "") and bound["g1"][0] == "n1"
        assert bound["g0"][0] in ("n1", "n2")
        # every live lease is the lease of a pod bound with it on its node
        leases = await w.leases()
        assert sorted((n, x.lease_id) for n, x in leases.values()) == sorted(bound.values())


async def test_a_gang_whose_commit_failed_on_one_node_keeps_no_lease_on_another(
    root: Path,
) -> None:
    """The commit succeeded on n1 and failed on n2 (its agent gone): an abort ends only
    reservations, so the member committed on n1 is released, not left for its retry to
    bind alone."""
    # the gang waits well past n1's hold (g0 reserves after it), however loaded the machine
    async with world(root, nodes=("n1", "n2"), hold_s=3.0, gang_ttl_s=20.0) as w:
        w.create("a")
        for name in ("g0", "g1"):
            w.create(name, gang="g", size=2)
        assert await w.bind("a", "n1") == (200, "")  # never allocated: n1's line waits
        binds = asyncio.gather(w.bind("g0", "n1"), w.bind("g1", "n2"))
        async with asyncio.timeout(10):
            while not (await w.leases_of("g0") and await w.leases_of("g1")):
                await asyncio.sleep(0.02)
        w.cache.set_targets({"n1": f"127.0.0.1:{w.apps['n1'].tcp_port}"})  # n2 is gone
        answers = await binds
        assert all(status == 200 and "n2" in error for status, error in answers), answers
        assert [n for n, _ in await w.leases_of("g0")] == []
        assert [n for n, _ in await w.leases_of("a")] == ["n1"]
