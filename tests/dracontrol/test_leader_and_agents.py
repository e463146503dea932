"""Only the leader answers (two controllers on one API stand-in, each under the floor's
leader election): the other waits, takes over on a clean stop, and a lost Lease stops the
leader's owed work at once. The real decider finds the agents as the extender path does
(the agents' EndpointSlices), reads them again for a node it does not know, and turns an
agent that gives no answer into an owed claim, never a refusal."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
import grpc.aio
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.dracontrol.agents import AgentDecider, AgentsOptions, EndpointTargets, connector
from agent.dracontrol.controller import BindingController
from agent.dracontrol.port import Unreached
from agent.kubeapi.leader import LeaderElector, LeaderOptions
from agent.kubeapi.rest import RestKubeApi
from tests.dracontrol.helpers import NODE, Agents, claim, conditions, until
from tests.kubeworld.apiserver import FakeApiServer

LEASE = ("gpushare-system", "gpushare-dra-controller")
FOREVER = 10**6


def fast(identity: str) -> LeaderOptions:
    return LeaderOptions(
        namespace=LEASE[0],
        name=LEASE[1],
        identity=identity,
        lease_duration_s=0.6,
        renew_deadline_s=0.4,
        retry_period_s=0.05,
    )


@contextlib.asynccontextmanager
async def elected(
    kube: RestKubeApi, agents: Agents, identity: str
) -> AsyncIterator[tuple[BindingController, LeaderElector, asyncio.Task[None]]]:
    controller = BindingController(kube, agents, backoff_s=0.05, backoff_max_s=0.1)
    elector = LeaderElector(kube, fast(identity))
    task = asyncio.create_task(elector.run(controller.run))
    try:
        yield controller, elector, task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def holder(api: FakeApiServer) -> str:
    lease = api.objects["leases"].get(LEASE)
    return str((lease or {}).get("spec", {}).get("holderIdentity") or "")


async def test_only_the_leader_answers_and_the_other_takes_over_on_a_clean_stop(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    a_agents, b_agents = Agents(), Agents()
    async with elected(kube, a_agents, "a") as (_, a, a_task):
        await until(lambda: holder(api) == "a")
        async with elected(kube, b_agents, "b") as (_, b, _):
            api.put_object("resourceclaims", claim("c", "gpu-0"))
            await until(lambda: bool(conditions(api, "c")))
            await asyncio.sleep(0.2)
            assert a_agents.asks and not b_agents.asks and not b.leading
            a_task.cancel()  # a clean stop: the Lease released
            with contextlib.suppress(asyncio.CancelledError):
                await a_task
            await until(lambda: b.leading)
            api.put_object("resourceclaims", claim("d", "gpu-1"))
            await until(lambda: bool(conditions(api, "d")))
            assert [name for _, name in b_agents.asks] == ["d"]
            assert not a.leading


async def test_a_lost_lease_stops_the_leaders_owed_work_at_once(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = Agents(down={NODE})  # the claim stays owed, asked again and again
    async with elected(kube, agents, "a") as (controller, elector, _):
        await until(lambda: elector.leading)
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: len(agents.asks) >= 2)
        stolen = api.objects["leases"][LEASE]
        stolen["spec"]["holderIdentity"] = "someone-else"
        stolen["spec"]["leaseDurationSeconds"] = 3600
        api.put_object("leases", stolen)
        await until(lambda: not elector.leading, timeout_s=3.0)
        assert controller.owing == 0  # its tries were cancelled with the work
        asks = len(agents.asks)
        await asyncio.sleep(0.4)
        assert len(agents.asks) == asks  # nothing asked, nothing written by a non-leader
        assert not conditions(api, "c")


# -- the real decider -------------------------------------------------------------------


class FakeLink:
    """An agent's gRPC client: answers, or fails with a gRPC status."""

    def __init__(self, target: str, failures: dict[str, grpc.StatusCode]) -> None:
        self.target = target
        self.failures = failures
        self.closed = False

    async def __aenter__(self) -> FakeLink:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.closed = True

    async def answer_claim(self, claim: Mapping[str, Any]) -> pb.AnswerClaimResponse:
        if self.target in self.failures:
            code = self.failures[self.target]
            raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")
        result = claim["status"]["allocation"]["devices"]["results"][0]
        answer = pb.ShareAnswer(
            device=result["device"],
            share_id=result["shareID"],
            admitted=True,
            reason="Admitted",
            message=f"from {self.target}",
        )
        return pb.AnswerClaimResponse(answers=[answer])


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED])
async def test_the_real_decider_finds_agents_by_their_endpoint_slices(
    api: FakeApiServer, kube: RestKubeApi, code: grpc.StatusCode
) -> None:
    options = AgentsOptions(discovery_interval_s=60.0)
    targets = EndpointTargets(kube, options)
    failures: dict[str, grpc.StatusCode] = {}
    links: list[FakeLink] = []

    def connect(target: str) -> FakeLink:
        links.append(FakeLink(target, failures))
        return links[-1]

    decider = AgentDecider(targets, connect)
    try:
        with pytest.raises(Unreached, match="no ready agent on node node-a"):
            await decider.answer(NODE, claim("c", "gpu-0"))
        api.set_endpoints(*options_where(options), [(NODE, "10.0.0.7")], port=9807)
        targets.MISS_S = 0.0  # an unknown node reads the slices again (once a second)
        said = await decider.answer(NODE, claim("c", "gpu-0"))
        assert [(a.device, a.admitted, a.message) for a in said] == [
            ("gpu-0", True, "from 10.0.0.7:9807")
        ]
        assert targets.reads == 2
        failures["10.0.0.7:9807"] = code
        with pytest.raises(Unreached, match=code.name):
            await decider.answer(NODE, claim("c", "gpu-0"))
        api.set_endpoints(*options_where(options), [(NODE, "10.0.0.8")], port=9807)
        targets.MISS_S = 60.0
        targets._read_at = None  # the interval passed
        await decider.answer(NODE, claim("c", "gpu-0"))
        assert [link.target for link in links] == ["10.0.0.7:9807", "10.0.0.8:9807"]
        assert links[0].closed  # the node's agent moved: its old channel closed
    finally:
        await decider.aclose()
    assert links[1].closed


def options_where(options: AgentsOptions) -> tuple[str, str]:
    return options.namespace, options.service


async def test_the_channels_of_nodes_gone_from_the_endpoint_slices_are_closed(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    options = AgentsOptions(discovery_interval_s=60.0)
    targets = EndpointTargets(kube, options)
    links: list[FakeLink] = []

    def connect(target: str) -> FakeLink:
        links.append(FakeLink(target, {}))
        return links[-1]

    decider = AgentDecider(targets, connect)
    where = options_where(options)
    try:
        api.set_endpoints(*where, [("node-a", "10.0.0.1"), ("node-b", "10.0.0.2")], port=9807)
        await decider.answer("node-a", claim("c", "gpu-0", node="node-a"))
        await decider.answer("node-b", claim("d", "gpu-0", node="node-b"))
        assert decider.linked == {"node-a", "node-b"}
        api.set_endpoints(*where, [("node-b", "10.0.0.2")], port=9807)  # node-a's agent left
        targets._read_at = None  # the interval passed
        await decider.answer("node-b", claim("d", "gpu-0", node="node-b"))
        assert decider.linked == {"node-b"}
        assert [(link.target, link.closed) for link in links] == [
            ("10.0.0.1:9807", True),
            ("10.0.0.2:9807", False),
        ]
        with pytest.raises(Unreached, match="no ready agent on node node-a"):
            await decider.answer("node-a", claim("c", "gpu-0", node="node-a"))
        api.set_endpoints(*where, [], port=9807)  # every agent gone: found by an ask of one
        targets._read_at = None
        with pytest.raises(Unreached):
            await decider.answer("node-b", claim("d", "gpu-0", node="node-b"))
        assert decider.linked == frozenset() and all(link.closed for link in links)
        assert len(links) == 2  # nothing opened again for the nodes gone
    finally:
        await decider.aclose()


async def test_the_endpoint_slices_failing_at_the_first_read_and_after_a_good_one(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    """No read yet: the node is Unreached (never a refusal). After a good read, a failed
    one keeps the targets last known, read again at the next interval."""
    options = AgentsOptions(discovery_interval_s=10.0)
    now = [0.0]
    targets = EndpointTargets(kube, options, clock=lambda: now[0])
    slices = r"/namespaces/gpushare-system/endpointslices"
    api.set_endpoints(*options_where(options), [(NODE, "10.0.0.7")], port=9807)
    outage = api.fail_next("GET", slices, 500, times=FOREVER)
    with pytest.raises(Unreached, match="the agents' endpoints are not known: 500"):
        await targets.target(NODE)
    api.faults.remove(outage)
    now[0] = 1.0  # an unknown node reads again at most once a second
    assert await targets.target(NODE) == "10.0.0.7:9807"
    known = targets.known()
    assert known.nodes == {NODE}
    api.fail_next("GET", slices, 503, times=FOREVER)
    now[0] = 20.0  # the interval passed: read again, and that read fails
    assert await targets.target(NODE) == "10.0.0.7:9807"  # the last known kept
    assert targets.known() == known and targets.reads == 1
    assert api.requests["list"] == 3


# -- a real agent that never answers ------------------------------------------------------


class SilentAgent(pb_grpc.AgentServicer):
    """The agent's gRPC service on loopback whose AnswerClaim hangs (past any deadline)
    until ``answering`` is set, then admits every waiting share."""

    def __init__(self) -> None:
        self.calls = 0
        self.answering = False

    async def AnswerClaim(
        self, request: pb.AnswerClaimRequest, context: grpc.aio.ServicerContext
    ) -> pb.AnswerClaimResponse:
        self.calls += 1
        if not self.answering:
            await asyncio.Event().wait()  # cancelled when the caller's deadline passes
        found = json.loads(request.claim_json)
        results = found["status"]["allocation"]["devices"]["results"]
        return pb.AnswerClaimResponse(
            answers=[
                pb.ShareAnswer(
                    device=r["device"], share_id=r["shareID"], admitted=True, reason="Admitted"
                )
                for r in results
            ]
        )


@contextlib.asynccontextmanager
async def silent_agent() -> AsyncIterator[tuple[SilentAgent, int]]:
    server = grpc.aio.server()
    servicer = SilentAgent()
    pb_grpc.add_AgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, port
    finally:
        await server.stop(0)


async def test_an_agent_past_its_deadline_is_unreached_and_its_claim_stays_owed(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    """The real decider over real gRPC: DEADLINE_EXCEEDED is Unreached, so the claim stays
    owed (asked again, no status written, never a refusal) until the agent answers."""
    options = AgentsOptions(insecure=True, call_timeout_s=0.2)
    async with silent_agent() as (agent, port):
        api.set_endpoints(*options_where(options), [(NODE, "127.0.0.1")], port=port)
        decider = AgentDecider(EndpointTargets(kube, options), connector(options))
        try:
            with pytest.raises(Unreached, match="DEADLINE_EXCEEDED"):
                await decider.answer(NODE, claim("x", "gpu-0"))
            controller = BindingController(kube, decider, backoff_s=0.05, backoff_max_s=0.2)
            running = asyncio.create_task(controller.run())
            try:
                api.put_object("resourceclaims", claim("c", "gpu-0"))
                await until(lambda: controller.counters.unreached >= 3, timeout_s=5.0)
                assert controller.owing == 1 and not conditions(api, "c")
                assert not any(m == "PUT" for m, _, _ in api.log)  # nothing written
                agent.answering = True
                await until(lambda: bool(conditions(api, "c")), timeout_s=5.0)
                assert conditions(api, "c") == [("gpu-0", "gpushare.io/admitted", "Admitted")]
            finally:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
        finally:
            await decider.aclose()
