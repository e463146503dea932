"""The node's ResourceSlice against the API stand-in (its schemas, its status codes): written
on a change only, coalesced, a generation per write, written again when the kubelet wipes
it, and every outcome of a write (done, refused, done with its answer lost, no answer)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from agent.dra.publisher import SlicePublisher
from agent.dra.slices import Capacity, SliceDevice, Taint
from agent.kubeapi.port import KubeError
from agent.kubeapi.rest import RestKubeApi
from tests.dra.fixtures import NODE, TOKEN
from tests.kubeworld.apiserver import FakeApiServer

CAPACITY = {
    "memory": Capacity("71Gi", "8Gi", min="256Mi", max="71Gi", step="1Mi"),
    "clients": Capacity("16", "1", valid_values=("1",)),
}


def device(name: str = "gpu-0", taint: str = "") -> SliceDevice:
    taints = (Taint(taint, "NoSchedule"),) if taint else ()
    return SliceDevice(
        name,
        attributes={"uuid": f"GPU-{name}", "index": 0, "protected": False},
        capacity=CAPACITY,
        taints=taints,
        binding_conditions=("gpushare.io/admitted",),
        binding_failure_conditions=("gpushare.io/refused",),
    )


def publisher(kube: RestKubeApi, **options: float) -> SlicePublisher:
    return SlicePublisher(kube, driver="gpushare.io", node=NODE, **options)


async def test_first_publish_creates_one_valid_slice_owned_by_the_node(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = publisher(kube)
    slices.publish([device("gpu-0"), device("gpu-1", "gpushare.io/drained")])
    assert await slices.sync_once() is True
    [stored] = api.objects("resourceslices")
    spec = stored["spec"]
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert (spec["driver"], spec["nodeName"]) == ("gpushare.io", NODE)
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    [owner] = stored["metadata"]["ownerReferences"]
    assert owner["uid"] == api.node(NODE)["metadata"]["uid"]  # type: ignore[index]
    assert stored["metadata"]["name"].startswith(f"{NODE}-gpushare.io-")


async def test_an_unchanged_node_writes_nothing_and_a_change_bumps_the_generation(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = publisher(kube)
    slices.publish([device()])
    await slices.sync_once()
    slices.publish([device()])  # the same devices again
    assert await slices.sync_once() is False
    assert slices.writes == 1
    slices.publish([device(taint="gpushare.io/degraded")])
    assert await slices.sync_once() is True
    [stored] = api.objects("resourceslices")
    assert stored["spec"]["pool"]["generation"] == 2
    assert stored["spec"]["devices"][0]["taints"][0]["key"] == "gpushare.io/degraded"


async def test_a_wiped_slice_is_written_again_and_strays_of_the_pool_are_deleted(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = publisher(kube)
    slices.publish([device()])
    await slices.sync_once()
    [first] = api.objects("resourceslices")
    api.delete_object("resourceslices", "", first["metadata"]["name"])  # the kubelet wipes
    assert await slices.sync_once() is True
    [again] = api.objects("resourceslices")
    assert again["spec"]["pool"]["generation"] == 2  # above the wiped one's
    stray = {**again, "metadata": {"name": "stray"}}
    stray["spec"] = {**again["spec"], "pool": {**again["spec"]["pool"], "generation": 1}}
    api.put_object("resourceslices", stray)
    await slices.sync_once()
    assert [s["metadata"]["name"] for s in api.objects("resourceslices")] == [
        again["metadata"]["name"]
    ]


async def test_a_burst_of_changes_is_one_write_of_the_last(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = publisher(kube, min_interval_s=0.5, resync_s=60.0)
    task = asyncio.create_task(slices.run())
    try:
        slices.publish([device()])
        await asyncio.wait_for(slices.synced.wait(), 5)
        for i in range(20):
            slices.publish([device(taint=f"gpushare.io/t{i % 3}")])
            await asyncio.sleep(0.01)
        slices.publish([device(taint="gpushare.io/last")])
        await asyncio.sleep(0.05)
        await asyncio.wait_for(slices.synced.wait(), 5)
        [stored] = api.objects("resourceslices")
        assert stored["spec"]["devices"][0]["taints"][0]["key"] == "gpushare.io/last"
        assert slices.writes == 2  # the create, then one write for the burst
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    ("fault", "landed"),
    [
        ({"status": 500}, False),  # refused (a server error): nothing created
        ({"status": 500, "landed": True}, True),  # done, its answer lost
        ({"status": 0}, False),  # the connection broke before it was served
        ({"hang": True, "landed": True}, True),  # done, then no answer at all
    ],
)
async def test_each_outcome_of_a_create_ends_with_exactly_one_slice(
    api: FakeApiServer, kube: RestKubeApi, fault: dict[str, object], landed: bool
) -> None:
    api.fail_next("POST", r"/resourceslices", **fault)  # type: ignore[arg-type]
    slices = publisher(kube)
    slices.publish([device()])
    with pytest.raises(KubeError):
        await slices.sync_once()
    assert len(api.objects("resourceslices")) == (1 if landed else 0)
    await slices.sync_once()  # the next round (the task retries with backoff)
    [stored] = api.objects("resourceslices")
    assert stored["spec"]["devices"][0]["name"] == "gpu-0"
    assert await slices.sync_once() is False  # and then it is at rest


async def test_a_conflicting_update_is_compared_again(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = publisher(kube)
    slices.publish([device()])
    await slices.sync_once()
    api.fail_next("PUT", r"/resourceslices/", status=409, reason="Conflict")
    slices.publish([device(taint="gpushare.io/drained")])
    with pytest.raises(KubeError):
        await slices.sync_once()
    assert await slices.sync_once() is True
    [stored] = api.objects("resourceslices")
    assert stored["spec"]["devices"][0]["taints"][0]["key"] == "gpushare.io/drained"


class GatesOffApi(RestKubeApi):
    """An API server without the binding-conditions gate: it drops those fields."""

    async def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return await super().create_resource_slice(self._drop(body))

    async def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await super().replace_resource_slice(name, self._drop(body))

    @staticmethod
    def _drop(body: dict[str, Any]) -> dict[str, Any]:
        gated = ("bindsToNode", "bindingConditions", "bindingFailureConditions")
        devices = [{k: v for k, v in d.items() if k not in gated} for d in body["spec"]["devices"]]
        return {**body, "spec": {**body["spec"], "devices": devices}}


async def test_fields_the_server_drops_are_said_once_and_not_written_again(
    api: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with GatesOffApi.from_url(api.url, token=TOKEN, timeout_s=2.0) as gates_off:
        slices = publisher(gates_off)  # type: ignore[arg-type]
        slices.publish([device()])
        assert await slices.sync_once() is True
        assert slices.dropped == ["bindingConditions", "bindingFailureConditions", "bindsToNode"]
        for _ in range(3):
            assert await slices.sync_once() is False  # at rest, not rewritten every pass
        assert slices.writes == 1
        assert caplog.text.count("dropped") == 1
