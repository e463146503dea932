"""AnswerClaim (issue 37, step 2: a node's cost follows its own work): the cluster's binding
controller sends a claim, the node's agent decides on its shares here that wait for a
binding condition and answers; it follows no claim itself. Over real gRPC (the agent's
Unix socket, :class:`agent.client.AgentClient`) to a real simulated agent that is the
node's DRA driver, publishing to the API stand-in: admitted with the lease Prepare finds,
refused with the agent's reason and no lease, a claim all or nothing, ``adminAccess``
without a lease, a refused device backing off, the same answer when asked again, nothing
asked of the API server, and malformed claims refused as INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient
from agent.runtime.app import App
from tests.dra.fixtures import DRIVER, NODE
from tests.helpers import running_app, sim_settings
from tests.kubeworld.apiserver import FakeApiServer

BINDING = {
    "bindingConditions": ["gpushare.io/admitted"],
    "bindingFailureConditions": ["gpushare.io/refused"],
}


def result(device: str, request: str = "gpu", *, pool: str = NODE, **extra: Any) -> dict[str, Any]:
    return {
        "request": request,
        "driver": DRIVER,
        "pool": pool,
        "device": device,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": "4Gi", "threads": "25"},
        **BINDING,
        **extra,
    }


def claim(*results: dict[str, Any], namespace: str = "team-a") -> dict[str, Any]:
    """A claim as the scheduler leaves it, allocated and waiting for its binding."""
    uid = str(uuid.uuid4())
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c-{uid[:8]}", "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def client(app: App) -> AgentClient:
    return AgentClient(f"unix:{app.settings.unix_socket_path}", attempts=1)


async def ask(app: App, asked: dict[str, Any]) -> list[tuple[str, str, bool, str]]:
    async with client(app) as agent:
        answer = await agent.answer_claim(asked)
    return [(a.device, a.share_id, a.admitted, a.reason) for a in answer.answers]


async def leases(app: App) -> list[pb.Lease]:
    async with client(app) as agent:
        return list((await agent.get_node(ledger_only=True)).leases)


async def refused(app: App, claim_json: bytes) -> grpc.aio.AioRpcError:
    async with client(app) as agent:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await agent.stub.AnswerClaim(pb.AnswerClaimRequest(claim_json=claim_json), timeout=5)
    return caught.value


def taints(api: FakeApiServer, device: str) -> list[str]:
    [published] = api.objects("resourceslices")
    [found] = [d for d in published["spec"]["devices"] if d["name"] == device]
    return [t["key"] for t in found.get("taints") or []]


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_a_share_that_fits_is_admitted_with_the_lease_prepare_finds(
    agent: App, api: FakeApiServer
) -> None:
    share = result("gpu-0")
    asked = claim(share)
    uid = asked["metadata"]["uid"]
    before = dict(api.requests)
    assert await ask(agent, asked) == [("gpu-0", share["shareID"], True, "Admitted")]
    [lease] = await leases(agent)
    assert lease.request_id == f"dra:{uid}:{share['shareID']}"  # Prepare's request id
    assert lease.memory_bytes == 4 * 2**30 and lease.thread_pct == 25
    assert lease.tenant == lease.trust_domain == "team-a"
    async with client(agent) as c:
        [answer] = (await c.answer_claim(asked)).answers
    assert answer.message.startswith(f"lease {lease.lease_id} on {lease.device_uuid}:")
    # the claim's name is kept on the node before its lease (the reconcile reads it by name)
    assert agent.dra is not None
    kept = agent.dra.driver.specs.index.get(uid)
    assert kept is not None and (kept.namespace, kept.name) == ("team-a", asked["metadata"]["name"])
    assert not {k for k in api.requests if "claim" in k.lower()} - set(before)  # no claim read


async def test_asked_again_it_answers_the_same_with_the_same_lease(agent: App) -> None:
    asked = claim(result("gpu-0"))
    first = await ask(agent, asked)
    [lease] = await leases(agent)
    again = await asyncio.gather(*(ask(agent, asked) for _ in range(3)))  # retries, at once
    assert all(a == first for a in again)
    assert [x.lease_id for x in await leases(agent)] == [lease.lease_id]


async def test_a_share_the_ledger_refuses_is_refused_with_its_reason_and_its_device_backs_off(
    agent: App, api: FakeApiServer
) -> None:
    first = claim(result("gpu-1", consumedCapacity={"memory": "60Gi", "threads": "25"}))
    assert [a[2:] for a in await ask(agent, first)] == [(True, "Admitted")]
    share = result("gpu-1", consumedCapacity={"memory": "30Gi", "threads": "25"})
    asked = claim(share)
    async with client(agent) as c:
        [answer] = (await c.answer_claim(asked)).answers
    assert (answer.device, answer.share_id, answer.admitted) == ("gpu-1", share["shareID"], False)
    assert answer.reason == "NO_MEMORY" and answer.message.startswith("NO_MEMORY: ")
    # the refused claim holds no lease; the first keeps its own
    assert [x.request_id.split(":")[1] for x in await leases(agent)] == [first["metadata"]["uid"]]
    await until(lambda: "gpushare.io/refused" in taints(api, "gpu-1"))
    assert "gpushare.io/refused" not in taints(api, "gpu-0")
    assert agent.dra is not None
    assert (agent.dra.stats().admitted, agent.dra.stats().refused) == (1, 1)
    assert [e.attrs.get("reason") for e in agent.events.since(0) if e.kind == "dra.refused"] == [
        "NO_MEMORY"
    ]


async def test_a_claim_is_all_or_nothing(agent: App, api: FakeApiServer) -> None:
    """Its share on gpu-0 fits, its share on gpu-1 does not: both are refused, the lease
    admitted on gpu-0 for it is given back, and only gpu-1 backs off."""
    big = {"memory": "90Gi", "threads": "25"}
    asked = claim(result("gpu-0", "small"), result("gpu-1", "big", consumedCapacity=big))
    answers = await ask(agent, asked)
    assert [(d, ok, why) for d, _, ok, why in answers] == [
        ("gpu-0", False, "NO_MEMORY"),
        ("gpu-1", False, "NO_MEMORY"),
    ]
    assert await leases(agent) == []
    await until(lambda: "gpushare.io/refused" in taints(api, "gpu-1"))
    assert "gpushare.io/refused" not in taints(api, "gpu-0")
    fits = claim(result("gpu-0", "small"), result("gpu-1", "big"))
    assert [a[2] for a in await ask(agent, fits)] == [True, True]
    assert len(await leases(agent)) == 2


async def test_two_shares_of_one_request_here_are_refused_for_what_they_ask(
    agent: App, api: FakeApiServer
) -> None:
    asked = claim(result("gpu-0"), result("gpu-1"))
    answers = await ask(agent, asked)
    assert {(ok, why) for _, _, ok, why in answers} == {(False, "ONE_SHARE_PER_REQUEST")}
    assert len(answers) == 2 and await leases(agent) == []
    await asyncio.sleep(0.3)  # the claim's fault, not the devices': neither backs off
    assert taints(api, "gpu-0") == taints(api, "gpu-1") == []


async def test_admin_access_is_admitted_without_a_lease(agent: App) -> None:
    admin = result("gpu-0", adminAccess=True)
    del admin["consumedCapacity"], admin["shareID"]
    answers = await ask(agent, claim(admin))
    assert answers == [("gpu-0", "", True, "AdminAccess")]
    assert await leases(agent) == []


async def test_nothing_waiting_here_is_an_empty_answer(agent: App) -> None:
    elsewhere = claim(result("gpu-0", pool="node-b"))
    plain = result("gpu-0")
    del plain["bindingConditions"], plain["bindingFailureConditions"]
    answered = claim(share := result("gpu-0"))
    answered["status"]["devices"] = [
        {
            "driver": DRIVER, "pool": NODE, "device": "gpu-0", "shareID": share["shareID"],
            "conditions": [{"type": "gpushare.io/admitted", "status": "True"}],
        }
    ]  # fmt: skip
    unallocated = claim()
    del unallocated["status"]
    for asked in (elsewhere, claim(plain), answered, unallocated):
        assert await ask(agent, asked) == []
    assert await leases(agent) == []


@pytest.mark.parametrize(
    ("claim_json", "says"),
    [
        (b"", "claim_json: is required"),
        (b"{not json", "claim_json: is not JSON"),
        (b"\xff\xfe", "claim_json: is not UTF-8 JSON"),
        (b"[1, 2]", "claim_json: is not a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "claim_json: nests too deep"),
        (b'{"metadata": "x"}', "claim_json.metadata: is not an object"),
        (b'{"metadata": {"namespace": "a", "name": "b"}}', "claim_json.metadata.uid"),
        (b'{"metadata": {"uid": "u", "namespace": "A B", "name": "b"}}', "metadata.namespace"),
        (b'{"metadata": {"uid": "u", "namespace": "a", "name": "b"}, "status": "x"}', "malformed"),
    ],
)
async def test_a_claim_that_cannot_be_read_is_invalid_argument(
    agent: App, claim_json: bytes, says: str
) -> None:
    error = await refused(agent, claim_json)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in (error.details() or "") and "Traceback" not in (error.details() or "")


async def test_results_that_cannot_be_read_are_invalid_argument(agent: App) -> None:
    bad_type = claim(result("gpu-0"))
    bad_type["status"]["allocation"]["devices"]["results"] = "gpu-0"
    bad_device = claim(result("gpu-0\n"))
    bad_capacity = claim(result("gpu-0", consumedCapacity={"memory": "lots"}))
    for asked in (bad_type, bad_device, bad_capacity):
        error = await refused(agent, json.dumps(asked).encode())
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert await leases(agent) == []


async def test_the_request_is_logged_with_its_caller_and_claim(
    agent: App, caplog: pytest.LogCaptureFixture
) -> None:
    asked = claim(result("gpu-0"))
    with caplog.at_level(logging.INFO, logger="agent.api.grpc_server"):
        await ask(agent, asked)
    meta = asked["metadata"]
    assert f"AnswerClaim from local: claim team-a/{meta['name']} (uid {meta['uid']})" in (
        caplog.text
    )


async def test_without_the_dra_driver_it_is_failed_precondition(root: Path) -> None:
    async with running_app(sim_settings(root, **{"estimator.model_dir": "none"})) as app:
        error = await refused(app, json.dumps(claim(result("gpu-0"))).encode())
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "dra.enabled" in (error.details() or "")
