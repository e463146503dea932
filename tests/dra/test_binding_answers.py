"""The binding answers against the API stand-in: each share waiting for one gets the
agent's word in the claim's ``status.devices`` exactly once, whatever the status write's
outcome (done, conflict, done with its answer lost, no answer), and a refused claim keeps
no lease."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from agent.core.lease import CLAIM_OWNER, Lease, LeaseState
from agent.core.types import PriorityClass
from agent.dra.claims import ClaimError, Share
from agent.kubeapi.rest import RestKubeApi
from agent.runtime.claims import ShareLeases
from agent.runtime.draanswers import BindingAnswers
from tests.dra.fixtures import DRIVER, NODE
from tests.kube.apiserver import FakeApiServer


class FakeNode:
    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}

    async def release(self, lease_id: str) -> Lease:
        return self.leases.pop(lease_id)


class FakeDriver:
    """The part of :class:`ClaimDriver` the answers use: a device refuses when it is full."""

    driver_name, node_name = DRIVER, NODE

    def __init__(self, full: set[str]) -> None:
        self.full = full
        self.node = FakeNode()
        self.leases = ShareLeases(self.node, default_memory_bytes=1, default_thread_pct=1)  # type: ignore[arg-type]
        self.admitted: list[str] = []
        self.notes: list[tuple[str, str]] = []
        self.refused_devices: list[str] = []

    def refused_device(self, device_name: str) -> None:
        self.refused_devices.append(device_name)

    def note(self, kind: str, message: str, claim: Mapping[str, Any], **attrs: str) -> None:
        self.notes.append((kind, attrs.get("reason", "")))

    async def admit_share(self, claim: Mapping[str, Any], share: Share) -> Lease:
        if share.device in self.full:
            raise ClaimError(f"NO_MEMORY: {share.device} is full")
        uid = claim["metadata"]["uid"]
        request_id = f"dra:{uid}:{share.key}"
        for held in self.node.leases.values():  # the same request id: the same lease
            if held.request_id == request_id:
                return held
        lease = Lease(
            f"l-{len(self.admitted)}", request_id, "ns", "ns", share.device,
            PriorityClass.BURSTABLE, 2**30, 10.0, LeaseState.ADMITTED, 0.0, 0.0,
            owner=CLAIM_OWNER,  # a claim's, as the driver's admissions make them
        )  # fmt: skip
        self.node.leases[lease.lease_id] = lease
        self.admitted.append(share.key)
        return lease


@pytest.fixture
def kube_timeout_s() -> float:
    return 1.0  # a status write with no answer is given up within a test's time


def claim(name: str, *devices: str) -> dict[str, Any]:
    results = [
        {
            "request": "gpu",
            "driver": DRIVER,
            "pool": NODE,
            "device": d,
            "shareID": f"5e0e2d4c-1111-4222-8333-00000000000{i}",
            "bindingConditions": ["gpushare.io/admitted"],
            "bindingFailureConditions": ["gpushare.io/refused"],
        }
        for i, d in enumerate(devices)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


@contextlib.asynccontextmanager
async def answering(
    kube: RestKubeApi, driver: FakeDriver, *, backoff_s: float = 0.05, **options: float
) -> AsyncIterator[BindingAnswers]:
    """The answers running; ``options``: :class:`BindingAnswers`' own."""
    answers = BindingAnswers(driver, kube, backoff_s=backoff_s, **options)  # type: ignore[arg-type]
    task = asyncio.create_task(answers.run())
    try:
        yield answers
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def conditions(api: FakeApiServer, name: str) -> list[tuple[str, str, str]]:
    [stored] = [c for c in api.objects("resourceclaims") if c["metadata"]["name"] == name]
    return [
        (d["device"], c["type"], c["reason"])
        for d in stored["status"].get("devices") or []
        for c in d["conditions"]
    ]


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "fault",
    [
        None,
        {"status": 409, "reason": "Conflict"},  # written meanwhile: read again, answer once
        {"status": 500, "landed": True},  # done, its answer lost
        {"status": 503},  # refused
        {"hang": True, "landed": True},  # done, no answer before the client gives up
        {"hang": True},  # not done, no answer
    ],
)
async def test_each_share_gets_one_answer_whatever_the_write_outcome(
    api: FakeApiServer, kube: RestKubeApi, fault: dict[str, Any] | None
) -> None:
    driver = FakeDriver(full=set())
    if fault is not None:
        api.fail_next("PUT", r"/resourceclaims/ok/status", **fault)
    async with answering(kube, driver):
        api.put_object("resourceclaims", claim("ok", "gpu-0"))
        api.put_object("resourceclaims", claim("ok2", "gpu-1"))
        await until(lambda: bool(conditions(api, "ok")) and bool(conditions(api, "ok2")))
        await asyncio.sleep(0.3)  # nothing more comes
    assert conditions(api, "ok") == [("gpu-0", "gpushare.io/admitted", "Admitted")]
    assert conditions(api, "ok2") == [("gpu-1", "gpushare.io/admitted", "Admitted")]
    assert len(driver.admitted) == len(driver.node.leases) == 2  # one lease per share


async def test_a_refused_share_keeps_no_lease(api: FakeApiServer, kube: RestKubeApi) -> None:
    driver = FakeDriver(full={"gpu-1"})
    async with answering(kube, driver) as answers:
        api.put_object("resourceclaims", claim("noisy", "gpu-1"))
        await until(lambda: bool(conditions(api, "noisy")))
    assert conditions(api, "noisy") == [("gpu-1", "gpushare.io/refused", "NO_MEMORY")]
    assert driver.node.leases == {}
    assert answers.refused == 1
    assert driver.notes == [("dra.refused", "NO_MEMORY")]
    assert driver.refused_devices == ["gpu-1"]  # the device backs off


async def test_a_refusal_whose_answer_was_lost_keeps_no_lease(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    """The refusal lands but its answer is lost: the claim is read again before anything
    else, so no share is admitted again behind the refusal."""
    driver = FakeDriver(full={"gpu-1"})
    api.fail_next("PUT", r"/resourceclaims/noisy/status", status=500, landed=True)
    async with answering(kube, driver):
        api.put_object("resourceclaims", claim("noisy", "gpu-1"))
        await until(lambda: bool(conditions(api, "noisy")))
        await asyncio.sleep(0.3)
    assert driver.node.leases == {} and driver.admitted == []


async def test_a_claim_with_two_shares_on_the_node_is_refused_whole(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    driver = FakeDriver(full=set())
    async with answering(kube, driver):
        api.put_object("resourceclaims", claim("two", "gpu-0", "gpu-1"))
        await until(lambda: len(conditions(api, "two")) == 2)
    assert {c[1:] for c in conditions(api, "two")} == {
        ("gpushare.io/refused", "ONE_SHARE_PER_REQUEST")
    }
    assert driver.node.leases == {} and driver.admitted == []


async def test_claims_of_other_drivers_nodes_or_without_conditions_are_left_alone(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    driver = FakeDriver(full=set())
    other = claim("other", "gpu-0")
    other["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    plain = claim("plain", "gpu-0")
    del plain["status"]["allocation"]["devices"]["results"][0]["bindingConditions"]
    del plain["status"]["allocation"]["devices"]["results"][0]["bindingFailureConditions"]
    async with answering(kube, driver):
        api.put_object("resourceclaims", other)
        api.put_object("resourceclaims", plain)
        api.put_object("resourceclaims", claim("mine", "gpu-0"))
        await until(lambda: bool(conditions(api, "mine")))
    assert conditions(api, "other") == [] and conditions(api, "plain") == []
    assert driver.admitted == ["5e0e2d4c-1111-4222-8333-000000000000"]


async def test_a_watch_whose_version_expired_lists_again_and_misses_no_claim(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    """410 Gone (the API server compacted its history): the answers list the claims again
    and follow from there; a claim allocated meanwhile still gets its answer."""
    driver = FakeDriver(full=set())
    async with answering(kube, driver):
        api.put_object("resourceclaims", claim("before", "gpu-0"))
        await until(lambda: bool(conditions(api, "before")))
        api.end_watches()
        api.put_object("resourceclaims", claim("meanwhile", "gpu-1"))
        api.compact()  # the watch comes back with a version the server forgot
        await until(lambda: bool(conditions(api, "meanwhile")))
    assert conditions(api, "meanwhile") == [("gpu-1", "gpushare.io/admitted", "Admitted")]
    assert api.requests["list"] == 2  # listed again
