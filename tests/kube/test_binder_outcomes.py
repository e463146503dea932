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
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient
from agent.kubeapi.port import Conflict, Gone, KubeError, NotFound, Unanswered
from agent.kubeapi.rest import RestKubeApi
from agent.legacy.cluster.binder import Binder, BindOptions
from agent.legacy.cluster.binding import Outcome, binding_outcome, refused
from agent.legacy.cluster.cache import AgentCache
from agent.legacy.cluster.controller import LeaseController
from agent.legacy.cluster.extender import Extender, build_extender_app
from agent.legacy.cluster.line import Line
from agent.legacy.podleases import LEASE_ANNOTATION
from agent.runtime.app import App, Ports
from tests.certs import make_token
from tests.helpers import fake_ports, running_app, sim_settings
from tests.kubeworld.apiserver import FakeApiServer, Fault, Obj

pytestmark = pytest.mark.timeout(120)

NS = "team-a"
API_TOKEN = "api-" + "0b9c2d7e4f1a8c3b5d6e9f0a7b2c4d1e"
AGENT_TOKEN = "agent-" + "3c5e7a9b1d2f4e6a8c0b9d7f5e3a1c2b"
CLIENT_TIMEOUT_S = 1.0  # the REST adapter's: a hanging Binding is given up after this
BINDING = r"^/api/v1/namespaces/team-a/pods/{name}/binding$"
POD = r"^/api/v1/namespaces/team-a/pods/{name}$"


def ports() -> Ports:
    return fake_ports(2)


@dataclass
class World:
    server: FakeApiServer
    kube: RestKubeApi
    cache: AgentCache
    binder: Binder
    apps: dict[str, App]
    extender_url: str
    session: aiohttp.ClientSession
    answers: list[tuple[int, str]] = field(default_factory=list)

    def create(self, name: str, *, gang: str = "", size: int = 0) -> Obj:
        annotations = {"gpushare.io/memory": "4Gi", "gpushare.io/threads": "20"}
        if gang:
            annotations |= {"gpushare.io/gang": gang, "gpushare.io/gang-size": str(size)}
        return self.server.create_pod(
            name,
            NS,
            annotations=annotations,
            scheduler_name="gpushare",
            finalizers=["gpushare.io/lease"],
            limits={"gpushare.io/share": 1},
            run_as_user=1000,
        )

    def pod(self, name: str) -> Obj:
        found = self.server.pod(NS, name)
        assert found is not None
        return found

    def placement(self, name: str) -> tuple[str, str]:
        """(node, lease annotation) of the pod as the API server has it."""
        pod = self.pod(name)
        return pod["spec"].get("nodeName", ""), pod["metadata"].get("annotations", {}).get(
            LEASE_ANNOTATION, ""
        )

    async def bind(self, name: str, node: str) -> tuple[int, str]:
        """The scheduler's bind call to the extender: (HTTP status, its Error)."""
        args = {
            "PodName": name,
            "PodNamespace": NS,
            "PodUID": self.pod(name)["metadata"]["uid"],
            "Node": node,
        }
        async with self.session.post(f"{self.extender_url}/bind", json=args) as response:
            if response.status != 200:
                answer = (response.status, await response.text())
            else:
                answer = (200, str((await response.json())["Error"]))
        self.answers.append(answer)
        return answer

    async def leases(self) -> dict[str, tuple[str, pb.Lease]]:
        """Every live lease of every agent: lease id -> (node, lease)."""
        found: dict[str, tuple[str, pb.Lease]] = {}
        for node, app in self.apps.items():
            async with AgentClient(f"127.0.0.1:{app.tcp_port}", token=AGENT_TOKEN) as agent:
                for lease in (await agent.get_node()).leases:
                    found[lease.lease_id] = (node, lease)
        return found

    async def leases_of(self, name: str) -> list[tuple[str, pb.Lease]]:
        return [(n, x) for n, x in (await self.leases()).values() if x.pod == f"{NS}/{name}"]


@contextlib.asynccontextmanager
async def world(
    root: Path, nodes: tuple[str, ...] = ("n1",), **options: float
) -> AsyncIterator[World]:
    """Agents for ``nodes``, the stand-in API server, and the extender over HTTP, its binder
    reading pods from an informer that is always current (the stand-in's store)."""
    make_token(root / "agent-token", AGENT_TOKEN)
    bind = {"hold_s": 0.5, "gang_ttl_s": 5.0, "resolve_s": 3.0, **options}
    async with FakeApiServer(token=API_TOKEN) as server, contextlib.AsyncExitStack() as stack:
        apps = {}
        for node in nodes:
            (root / node).mkdir()
            settings = sim_settings(
                root / node,
                **{
                    "api.tcp_listen": "127.0.0.1:0",
                    "api.token_file": str(root / "agent-token"),
                    "api.insecure_loopback": True,
                    "estimator.model_dir": "none",
                },
            )
            apps[node] = await stack.enter_async_context(running_app(settings, ports()))
        kube = RestKubeApi.from_url(server.url, token=API_TOKEN, timeout_s=CLIENT_TIMEOUT_S)
        stack.push_async_callback(kube.aclose)
        cache = AgentCache(lambda target: AgentClient(target, token=AGENT_TOKEN, attempts=2))
        stack.push_async_callback(cache.aclose)
        cache.set_targets({n: f"127.0.0.1:{app.tcp_port}" for n, app in apps.items()})
        await cache.wait_ready(20.0)

        def informer(uid: str) -> Obj | None:
            pods = server.objects["pods"].values()
            return next((p for p in pods if p["metadata"]["uid"] == uid), None)

        binder = Binder(kube, cache, BindOptions(**bind), pods=informer)
        stack.push_async_callback(binder.aclose)
        runner = web.AppRunner(build_extender_app(Extender(cache, binder, Rules())))
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        session = await stack.enter_async_context(aiohttp.ClientSession())
        yield World(server, kube, cache, binder, apps, url, session)


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


# -- gangs ---------------------------------------------------------------------------------


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


# -- the pure parts ------------------------------------------------------------------------


def test_a_pods_next_try_takes_the_place_of_its_turn_that_kept_the_lease() -> None:
    line = Line()
    kept = line.join()
    line.start(kept)
    nxt, later = line.join(), line.join()  # waiting for kept's lease to be allocated
    line.end(kept, "L1", 1.0)
    again = line.rejoin(kept)
    assert again.previous is None  # it waits for nobody, its own lease least of all
    assert (nxt.previous, later.previous) == (again, nxt)
    assert nxt.moved.is_set()  # woken to wait for the try that binds L1
    assert line.waiting == [again, nxt, later]


def test_a_pods_next_try_after_the_line_moved_on_goes_ahead_of_the_pods_waiting() -> None:
    line = Line()
    kept = line.join()
    line.start(kept)
    line.end(kept, "L1", 1.0)
    nxt = line.join()
    line.start(nxt)  # its hold passed: it went on
    waiting = line.join()
    again = line.rejoin(kept)
    assert (again.previous, waiting.previous) == (nxt, again)
    assert line.waiting == [again, waiting]


def test_a_lease_given_back_lets_the_turn_waiting_for_it_go() -> None:
    line = Line()
    kept = line.join()
    line.start(kept)
    nxt = line.join()
    line.end(kept, "L1", 1.0)
    line.gave_back(kept)
    assert kept.lease_id == "" and nxt.moved.is_set()


def _pod(node: str = "", lease: str = "", uid: str = "u1") -> Obj:
    return {
        "metadata": {"uid": uid, "annotations": {LEASE_ANNOTATION: lease} if lease else {}},
        "spec": {"nodeName": node} if node else {},
    }


@pytest.mark.parametrize(
    ("pod", "outcome", "why"),
    [
        (_pod("n1", "L1"), Outcome.BOUND, ""),
        (None, Outcome.NOT_BOUND, "the pod is gone"),
        (_pod("n1", "L1", uid="u2"), Outcome.NOT_BOUND, "another pod of that name"),
        (_pod(), Outcome.NOT_BOUND, "the pod is not bound"),
        (_pod("n2", "L1"), Outcome.NOT_BOUND, "the pod is bound to n2"),
        (_pod("n1", "L2"), Outcome.NOT_BOUND, "the pod is bound with lease L2"),
        (_pod("n1"), Outcome.BOUND, ""),  # no annotation: the lease is the pod's own
    ],
)
def test_the_pod_read_back_decides(pod: Obj | None, outcome: Outcome, why: str) -> None:
    assert binding_outcome(pod, "u1", "n1", "L1") == (outcome, why)


@pytest.mark.parametrize(
    ("error", "sure"),
    [
        (KubeError(422, "Invalid", ""), True),
        (Gone(410, "Expired", ""), True),
        (NotFound(404, "NotFound", ""), True),
        (KubeError(429, "TooManyRequests", ""), True),
        (KubeError(0, "Unreachable", "connection refused"), True),  # never sent
        (Conflict(409, "Conflict", ""), False),  # bound already: by this bind, maybe
        (KubeError(500, "InternalError", ""), False),
        (KubeError(504, "Timeout", ""), False),
        (Unanswered(0, "Unreachable", "timed out"), False),
        (KubeError(201, "BadResponse", "not JSON"), False),  # answered 201: it landed
    ],
)
def test_only_a_refusal_is_sure_to_have_changed_nothing(error: KubeError, sure: bool) -> None:
    assert refused(error) is sure


async def test_the_rest_adapter_tells_a_request_never_sent_from_one_unanswered(
    root: Path,
) -> None:
    async with FakeApiServer() as server:
        server.create_pod("p", NS)
        async with RestKubeApi.from_url(server.url, timeout_s=0.5) as kube:
            server.fail_next("POST", BINDING.format(name="p"), hang=True)
            with pytest.raises(Unanswered):
                await kube.bind_pod(NS, "p", "", "n1")
            server.fail_next("POST", BINDING.format(name="p"), landed=True)
            with pytest.raises(Unanswered):
                await kube.bind_pod(NS, "p", "", "n1")
        url = server.url
    async with RestKubeApi.from_url(url, timeout_s=0.5) as kube:  # nobody listens there
        with pytest.raises(KubeError) as caught:
            await kube.bind_pod(NS, "p", "", "n1")
        assert not isinstance(caught.value, Unanswered)
        assert (caught.value.status, caught.value.reason) == (0, "Unreachable")


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
