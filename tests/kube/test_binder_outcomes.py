"""Every way the API server can answer a Binding, against what the binder then does.

The parts are real: the stand-in API server over HTTP on loopback (answering each way:
:meth:`FakeApiServer.fail_next`), the REST adapter with a short timeout, real agents (the
simulated node in this process, over gRPC with a token) and the extender's HTTP app. Each
row asserts the pod's final binding, its lease at the agent and the extender's answer.

A Binding whose answer says nothing sure (a 5xx, a timeout, a broken connection, a 409)
is resolved by reading the pod back: bound to the node with its lease, the lease is kept
and the bind is done; not bound, the lease is given back; unreadable, the lease is kept for
the pod's next try and nothing is guessed.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from agent.client import AgentClient
from agent.kubeapi.rest import RestKubeApi
from agent.legacy.cluster.cache import AgentCache
from agent.legacy.cluster.controller import LeaseController
from tests.kube.binder_world import (
    AGENT_TOKEN,
    API_TOKEN,
    BINDING,
    CLIENT_TIMEOUT_S,
    NS,
    POD,
    world,
)
from tests.kubeworld.apiserver import FakeApiServer, Fault

pytestmark = pytest.mark.timeout(120)


# -- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One way the Binding is answered, and what must follow."""

    status: int = 201  # 201: no fault; 0: no answer (a break, or a hang)
    landed: bool = False
    hang: bool = False
    unreadable: bool = False  # the pod cannot be read back afterwards (503)
    read_hangs: bool = False  # ... nor answers at all
    every_time: bool = False  # the Binding is answered so however often it is sent
    bound: bool = False  # the pod ends bound to the node with its lease
    kept: bool = False  # the lease is live at the agent
    answer: str = ""  # in the extender's Error ("" for none)


# A Binding whose answer is not sure is sent again (the fault answers once): the pod ends
# bound with its lease whether or not the first landed; a 409 (a Binding of the pod
# landed) or answers that stay unsure make the binder read the pod back.
TABLE = {
    "201": Row(bound=True, kept=True),
    "409, bound before with this lease": Row(409, landed=True, bound=True, kept=True),
    "409, not bound": Row(409, answer="409 Conflict"),
    "410": Row(410, answer="410 Expired"),
    "5xx, landed": Row(500, landed=True, bound=True, kept=True),
    "5xx, not landed": Row(503, bound=True, kept=True),
    "timeout, landed": Row(0, landed=True, hang=True, bound=True, kept=True),
    "timeout, not landed": Row(0, hang=True, bound=True, kept=True),
    "reset before the write": Row(0, bound=True, kept=True),
    "reset after the write": Row(0, landed=True, bound=True, kept=True),
    "5xx, landed, unreadable": Row(
        500, landed=True, unreadable=True, bound=True, kept=True, answer="kept"
    ),
    "5xx, not landed, unreadable": Row(500, unreadable=True, bound=True, kept=True),
    "timeout, not landed, unreadable": Row(0, hang=True, unreadable=True, bound=True, kept=True),
    "5xx, landed, read back hangs": Row(
        500, landed=True, read_hangs=True, bound=True, kept=True, answer="kept"
    ),
    "5xx every time, not landed": Row(500, every_time=True, kept=True, answer="kept"),
}


@pytest.mark.parametrize("row", TABLE.values(), ids=TABLE.keys())
async def test_each_answer_to_a_binding_and_what_the_binder_does(root: Path, row: Row) -> None:
    async with world(root) as w:
        w.create("p")
        if row.status != 201:
            w.server.fail_next(
                "POST",
                BINDING.format(name="p"),
                row.status,
                landed=row.landed,
                hang=row.hang,
                times=1000 if row.every_time else 1,
            )
        if row.unreadable or row.read_hangs:
            w.server.fail_next("GET", POD.format(name="p"), 503, times=1000, hang=row.read_hangs)

        status, error = await w.bind("p", "n1")

        w.server.faults.clear()
        assert status == 200, error  # never a 500
        assert (error == "") if not row.answer else (row.answer in error), error
        leases = await w.leases_of("p")
        assert len(leases) == (1 if row.kept else 0), leases
        node, lease_id = w.placement("p")
        if row.bound:
            [(_, lease)] = leases
            assert (node, lease_id) == ("n1", lease.lease_id)
            assert lease.state == "admitted"
        else:
            assert node == ""


async def test_a_lease_kept_while_the_outcome_was_unknown_is_bound_by_the_pods_next_try(
    root: Path,
) -> None:
    """Neither released nor guessed bound: the scheduler's next try takes the same lease
    (the same request id) and binds with it."""
    async with world(root) as w:
        w.create("p")
        w.server.fail_next("POST", BINDING.format(name="p"), 500, times=1000)
        w.server.fail_next("GET", POD.format(name="p"), 503, times=1000)
        status, error = await w.bind("p", "n1")
        assert status == 200 and "kept" in error
        [(_, kept)] = await w.leases_of("p")
        w.server.faults.clear()

        assert await w.bind("p", "n1") == (200, "")
        [(_, lease)] = await w.leases_of("p")
        assert lease.lease_id == kept.lease_id
        assert w.placement("p") == ("n1", kept.lease_id)


async def test_a_lease_kept_on_one_node_is_given_back_once_the_pod_is_bound_on_another(
    root: Path,
) -> None:
    async with world(root, nodes=("n1", "n2")) as w:
        w.create("p")
        w.server.fail_next("POST", BINDING.format(name="p"), 500, times=1000)
        w.server.fail_next("GET", POD.format(name="p"), 503, times=1000)
        assert "kept" in (await w.bind("p", "n1"))[1]
        w.server.faults.clear()

        assert await w.bind("p", "n2") == (200, "")
        [(node, lease)] = await w.leases_of("p")
        assert node == "n2" and w.placement("p") == ("n2", lease.lease_id)


# -- a caller that goes away, a binder that stops ------------------------------------------


@pytest.mark.parametrize("binding", ["landed", "refused"])
async def test_a_bind_whose_caller_went_away_is_finished_or_undone_by_the_binder(
    root: Path, binding: str
) -> None:
    """The scheduler closed the connection (the handler was cancelled) while the Binding
    was in flight: the bind goes on; bound, its lease is kept, refused, given back."""
    async with world(root) as w:
        uid = w.create("p")["metadata"]["uid"]
        held = w.server.hold_next("POST", BINDING.format(name="p"))
        if binding == "refused":
            w.server.fail_next("POST", BINDING.format(name="p"), 422)
        caller = asyncio.ensure_future(w.binder.bind(NS, "p", uid, "n1"))
        async with asyncio.timeout(10):
            await held.arrived.wait()
        caller.cancel()
        await asyncio.gather(caller, return_exceptions=True)
        held.release.set()

        async with asyncio.timeout(10):
            while w.binder.in_flight:
                await asyncio.sleep(0.02)
        leases = await w.leases_of("p")
        if binding == "landed":
            [(_, lease)] = leases
            assert w.placement("p") == ("n1", lease.lease_id)
        else:
            assert leases == [] and w.placement("p") == ("", "")


async def test_a_bind_sent_again_while_the_first_runs_waits_for_it(root: Path) -> None:
    async with world(root) as w:
        w.create("p")
        held = w.server.hold_next("POST", BINDING.format(name="p"))
        first = asyncio.ensure_future(w.bind("p", "n1"))
        async with asyncio.timeout(10):
            await held.arrived.wait()
        again = asyncio.ensure_future(w.bind("p", "n1"))
        await asyncio.sleep(0.2)
        assert not again.done()
        held.release.set()
        assert await asyncio.gather(first, again) == [(200, ""), (200, "")]
        [(_, lease)] = await w.leases_of("p")
        assert w.placement("p") == ("n1", lease.lease_id)
        assert w.server.requests["create"] == 1  # one Binding: the second read the pod


async def test_a_binder_that_stops_lets_a_binding_in_flight_finish(root: Path) -> None:
    async with world(root) as w:
        uid = w.create("p")["metadata"]["uid"]
        held = w.server.hold_next("POST", BINDING.format(name="p"))
        caller = asyncio.ensure_future(w.binder.bind(NS, "p", uid, "n1"))
        async with asyncio.timeout(10):
            await held.arrived.wait()
        closing = asyncio.ensure_future(w.binder.aclose())
        await asyncio.sleep(0.2)
        assert not closing.done()  # the Binding is not cut in half
        held.release.set()
        await closing
        await asyncio.gather(caller, return_exceptions=True)
        [(_, lease)] = await w.leases_of("p")
        assert w.placement("p") == ("n1", lease.lease_id)


# -- the lease controller's writes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "landed", "hang"),
    [(500, True, False), (0, True, True), (0, True, False), (503, False, False)],
    ids=["5xx, landed", "timeout, landed", "reset after the write", "5xx, not landed"],
)
async def test_a_finalizer_removal_whose_answer_was_lost_settles_the_pod_once(
    status: int, landed: bool, hang: bool
) -> None:
    """The controller's finalizer patch is compare-and-set on the resourceVersion: sent
    again after a 5xx or a timeout, it finds the pod gone (the first one landed) or
    applies; the pod is settled either way, nothing is left to the reconcile."""
    async with (
        FakeApiServer(token=API_TOKEN) as server,
        RestKubeApi.from_url(server.url, token=API_TOKEN, timeout_s=CLIENT_TIMEOUT_S) as kube,
    ):
        cache = AgentCache(lambda target: AgentClient(target, token=AGENT_TOKEN))
        controller = LeaseController(kube, cache, reconcile_interval_s=60.0)
        tasks = [
            asyncio.ensure_future(controller.follow()),
            asyncio.ensure_future(controller.act()),
        ]
        try:
            server.create_pod("p", NS, scheduler_name="gpushare", finalizers=["gpushare.io/lease"])
            await controller.wait_synced()
            server.fail_next("PATCH", POD.format(name="p"), status, landed=landed, hang=hang)
            server.delete_pod(NS, "p")
            async with asyncio.timeout(20):
                while server.pod(NS, "p") is not None or controller._settling:
                    await asyncio.sleep(0.05)
            assert server.faults == []
            assert not controller._unsettled
            patches = [m for m, path, _ in server.log if m == "PATCH" and path.endswith("/p")]
            assert len(patches) == 2  # the one whose answer was lost, and one more
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await cache.aclose()


async def test_a_binding_that_lands_after_its_client_gave_up_leaves_the_pod_with_its_lease(
    root: Path,
) -> None:
    """The API server applies the first Binding only after its client gave up (and after
    any read-back could have shown the pod unbound): the binder sent the same Binding
    again meanwhile, so whichever of the two lands binds the pod with the same lease, and
    the other is refused. Releasing after a read-back left the pod bound with a lease
    given back."""
    async with world(root) as w:
        w.create("p")
        late = asyncio.Event()
        binding = re.compile(r"/pods/p/binding$")
        landings: list[asyncio.Task[object]] = []

        async def land_later(request: web.Request) -> object:
            await late.wait()
            return await w.server._bind(request)  # the write goes through after all

        async def chaos(request: web.Request) -> Fault | None:
            if request.method == "POST" and binding.search(request.path):
                await request.read()
                landings.append(asyncio.create_task(land_later(request)))
                w.server.chaos = None
                return Fault("POST", binding, 0, "", "slow", 1, hang=True)
            return None

        w.server.chaos = chaos
        assert await w.bind("p", "n1") == (200, "")
        late.set()
        await asyncio.gather(*landings, return_exceptions=True)
        node, lease_id = w.placement("p")
        assert node == "n1"
        assert lease_id in {x.lease_id for _, x in await w.leases_of("p")}
