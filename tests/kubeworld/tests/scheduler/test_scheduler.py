"""The DRA scheduler stand-in against the API stand-in, everything put in over HTTP: a pod's
template claim made, allocated and the pod bound; binding conditions met, failed, or
timing out; extended resources mapped to a claim; concurrent pods never overfilling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from tests.dra.fixtures import DRIVER, device, device_class, memory, request, resource_slice
from tests.kubeworld import apiserver
from tests.kubeworld.apiserver import FakeApiServer
from tests.kubeworld.scheduler import EXTENDED_ANNOTATION, POD_CLAIM_ANNOTATION, DraSchedulerStandIn

pytestmark = pytest.mark.skipif(
    "resourceclaims" not in apiserver.KINDS,
    reason="needs the resource.k8s.io kinds of the API stand-in",
)
Obj = dict[str, Any]
TOKEN = "t0ken"
NS = "team-a"
DRA = "/apis/resource.k8s.io/v1"


class Cluster:
    """The API stand-in's HTTP API, as a test puts things in and reads them back."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url, self.session = url, session
        self.binding = False  # whether the devices of nodes added have binding conditions

    async def call(self, method: str, path: str, body: Any = None) -> Obj:
        async with self.session.request(method, self.url + path, json=body) as response:
            answer: Obj = await response.json()
            assert response.status < 300, answer
            return answer

    async def node(self, name: str) -> None:
        await self.call("POST", "/api/v1/nodes", {"metadata": {"name": name}, "spec": {}})
        # what the driver publishes for its node: one slice, two shared GPUs
        gpus = [device("gpu-0", binding=self.binding), device("gpu-1", binding=self.binding)]
        body = resource_slice(gpus, node=name, name=f"00000-{DRIVER}-{name}-x1")
        await self.call("POST", f"{DRA}/resourceslices", body)

    async def template(self, name: str = "gpu", **options: Any) -> None:
        body = {
            "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [request(**options)]}}},
        }
        await self.call("POST", f"{DRA}/namespaces/{NS}/resourceclaimtemplates", body)

    async def pod(self, name: str, *, template: str = "gpu", limits: Obj | None = None) -> Obj:
        container: Obj = {"name": "main", "image": "registry.example/train:1.0"}
        spec: Obj = {"containers": [container]}
        if limits:
            container["resources"] = {"limits": limits}
        else:
            container["resources"] = {"claims": [{"name": "gpu"}]}
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        body = {"metadata": {"name": name, "namespace": NS}, "spec": spec}
        return await self.call("POST", f"/api/v1/namespaces/{NS}/pods", body)

    async def get_pod(self, name: str) -> Obj:
        return await self.call("GET", f"/api/v1/namespaces/{NS}/pods/{name}")

    async def claims(self) -> list[Obj]:
        listing = await self.call("GET", f"{DRA}/namespaces/{NS}/resourceclaims")
        return list(listing["items"])

    async def claim(self, name: str) -> Obj:
        return await self.call("GET", f"{DRA}/namespaces/{NS}/resourceclaims/{name}")

    async def answer(self, claim: Obj, condition: str, reason: str) -> None:
        """What gpushare's agent writes: one status.devices entry per result."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        entries = [
            {
                **{k: r[k] for k in ("driver", "pool", "device", "shareID")},
                "conditions": [
                    {
                        "type": condition,
                        "status": "True",
                        "reason": reason,
                        "message": f"{reason} by the agent",
                        "lastTransitionTime": now,
                    }
                ],
            }
            for r in claim["status"]["allocation"]["devices"]["results"]
        ]
        body = {**claim, "status": {**claim["status"], "devices": entries}}
        path = f"{DRA}/namespaces/{NS}/resourceclaims/{claim['metadata']['name']}/status"
        await self.call("PUT", path, body)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN) as server:
        yield server


@pytest.fixture
async def cluster(api: FakeApiServer) -> AsyncIterator[Cluster]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        made = Cluster(api.url, session)
        await made.call("POST", f"{DRA}/deviceclasses", device_class(extended="gpushare.io/gpu"))
        yield made


@contextlib.asynccontextmanager
async def scheduling(api: FakeApiServer, **options: Any) -> AsyncIterator[DraSchedulerStandIn]:
    options = {"binding_timeout_s": 2.0, "poll_s": 0.05, "backoff_s": 0.1, "seed": 7, **options}
    async with DraSchedulerStandIn(api.url, token=TOKEN, **options) as scheduler:
        task = asyncio.create_task(scheduler.run())
        try:
            yield scheduler
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = 10.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        if found := await check():
            return found
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_template_claim_is_made_allocated_and_the_pod_bound(
    api: FakeApiServer, cluster: Cluster
) -> None:
    await cluster.node("node-a")
    await cluster.template(capacity={"memory": "1.5Gi"})
    pod = await cluster.pod("train-0")
    async with scheduling(api) as scheduler:
        node = await eventually(lambda: _bound(cluster, "train-0"))
    assert node == "node-a" and scheduler.bound == {f"{NS}/train-0": "node-a"}
    (claim,) = await cluster.claims()
    meta = claim["metadata"]
    assert meta["name"].startswith("train-0-gpu-") and len(meta["name"]) == len("train-0-gpu-") + 5
    assert meta["annotations"][POD_CLAIM_ANNOTATION] == "gpu"
    assert meta["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    status = claim["status"]
    (result,) = status["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"memory": "2Gi", "threads": "10"}
    assert status["reservedFor"] == [
        {"resource": "pods", "name": "train-0", "uid": pod["metadata"]["uid"]}
    ]
    bound = await cluster.get_pod("train-0")
    assert bound["status"]["resourceClaimStatuses"] == [
        {"name": "gpu", "resourceClaimName": meta["name"]}
    ]


async def test_binding_condition_true_binds(api: FakeApiServer, cluster: Cluster) -> None:
    cluster.binding = True
    await cluster.node("node-a")
    await cluster.template()
    await cluster.pod("train-0")
    async with scheduling(api):
        claim = await eventually(lambda: _allocated(cluster))
        assert claim["status"]["allocation"]["allocationTimestamp"]
        assert not (await cluster.get_pod("train-0"))["spec"].get("nodeName")
        await cluster.answer(claim, "gpushare.io/admitted", "Admitted")
        assert await eventually(lambda: _bound(cluster, "train-0")) == "node-a"


async def test_failure_condition_deallocates_and_retries_elsewhere(
    api: FakeApiServer, cluster: Cluster
) -> None:
    cluster.binding = True
    await cluster.node("node-a")
    await cluster.node("node-b")
    await cluster.template()
    await cluster.pod("train-0")
    async with scheduling(api) as scheduler:
        first = await eventually(lambda: _allocated(cluster))
        refused = _node_of(first)
        await cluster.answer(first, "gpushare.io/refused", "Refused_NO_MEMORY")
        second = await eventually(lambda: _allocated(cluster, other_than=refused))
        await cluster.answer(second, "gpushare.io/admitted", "Admitted")
        node = await eventually(lambda: _bound(cluster, "train-0"))
    assert node != refused
    message = "binding failed: reason=Refused_NO_MEMORY, message=Refused_NO_MEMORY by the agent"
    assert scheduler.failures == [(f"{NS}/train-0", message)]
    events = api.events_for("train-0", NS)
    assert [(e["reason"], e["message"]) for e in events] == [("FailedScheduling", message)]


async def test_binding_timeout_deallocates_and_retries(
    api: FakeApiServer, cluster: Cluster
) -> None:
    cluster.binding = True
    await cluster.node("node-a")
    await cluster.template()
    await cluster.pod("train-0")
    async with scheduling(api, binding_timeout_s=0.3) as scheduler:
        await eventually(lambda: _failed(scheduler, "device binding timeout"))
        claim = await eventually(lambda: _allocated(cluster))
        await cluster.answer(claim, "gpushare.io/admitted", "Admitted")
        assert await eventually(lambda: _bound(cluster, "train-0")) == "node-a"
    # the one node was left out of the attempt right after the timeout
    assert any("left out after a failed binding" in m for _, m in scheduler.failures)
    assert scheduler.attempts[f"{NS}/train-0"] >= 3


async def test_extended_resource_gets_a_claim_with_defaults(
    api: FakeApiServer, cluster: Cluster
) -> None:
    await cluster.node("node-a")
    pod = await cluster.pod("infer-0", limits={"gpushare.io/gpu": "2"})
    async with scheduling(api):
        assert await eventually(lambda: _bound(cluster, "infer-0")) == "node-a"
    (claim,) = await cluster.claims()
    meta = claim["metadata"]
    assert meta["name"].startswith("infer-0-extended-resources-")
    assert meta["annotations"] == {EXTENDED_ANNOTATION: "true"}
    assert meta["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert claim["spec"]["devices"]["requests"] == [
        {
            "name": "container-0-request-0",
            "exactly": {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 2},
        }
    ]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-0", "gpu-1"]
    assert all(r["consumedCapacity"] == {"memory": "1Gi", "threads": "10"} for r in results)
    status = (await cluster.get_pod("infer-0"))["status"]["extendedResourceClaimStatus"]
    assert status == {
        "resourceClaimName": meta["name"],
        "requestMapping": [
            {
                "containerName": "main",
                "extendedResourceName": "gpushare.io/gpu",
                "requestName": "container-0-request-0",
            }
        ],
    }


async def test_concurrent_pods_never_overfill_a_device(
    api: FakeApiServer, cluster: Cluster
) -> None:
    await cluster.call("POST", "/api/v1/nodes", {"metadata": {"name": "node-a"}, "spec": {}})
    small = device("gpu-0", capacity={"memory": memory("4Gi")})
    body = resource_slice([small], name="00000-gpushare.io-node-a-x1")
    await cluster.call("POST", f"{DRA}/resourceslices", body)
    await cluster.template(capacity={"memory": "1Gi"})
    for i in range(6):
        await cluster.pod(f"train-{i}")
    # the first allocation's write is held: the others must count it all the same
    held = api.hold_next("PUT", r"/resourceclaims/[^/]+/status$")
    async with scheduling(api) as scheduler:
        await held.arrived.wait()
        await eventually(lambda: _unschedulable(scheduler, 2))
        held.release.set()
        await eventually(lambda: _count(scheduler.bound, 4))
    claims = [c for c in await cluster.claims() if (c.get("status") or {}).get("allocation")]
    consumed = [
        r["consumedCapacity"]["memory"]
        for c in claims
        for r in c["status"]["allocation"]["devices"]["results"]
    ]
    assert consumed == ["1Gi"] * 4


async def _bound(cluster: Cluster, name: str) -> str | None:
    return (await cluster.get_pod(name))["spec"].get("nodeName")


async def _allocated(cluster: Cluster, other_than: str = "") -> Obj | None:
    for claim in await cluster.claims():
        if (claim.get("status") or {}).get("allocation") and _node_of(claim) != other_than:
            return claim
    return None


def _node_of(claim: Obj) -> str:
    term = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
    return str(term["matchFields"][0]["values"][0])


async def _failed(scheduler: DraSchedulerStandIn, message: str) -> bool:
    return any(m == message for _, m in scheduler.failures)


async def _count(found: dict[str, str], wanted: int) -> bool:
    return len(found) == wanted


async def _unschedulable(scheduler: DraSchedulerStandIn, pods: int) -> bool:
    refused = {pod for pod, m in scheduler.failures if "cannot allocate all claims" in m}
    return len(refused) == pods
