"""A node with more devices than one ResourceSlice holds publishes its pool as several slices,
against the API stand-in: every slice of the pool names the same generation and the number
of slices, a change moves the whole pool to a new generation, extra slices go, and whatever
the writes' outcomes the API ends with one complete pool (what the scheduler needs to use
any device of it: tests/kubeworld/scheduler/allocator.py, R1)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from agent.dra.publisher import SlicePublisher
from agent.dra.slices import MAX_DEVICES, Capacity, SliceDevice, Taint
from agent.kubeapi.port import KubeError
from agent.kubeapi.rest import RestKubeApi
from tests.dra.fixtures import DRIVER, NODE
from tests.kubeworld.apiserver import FakeApiServer
from tests.kubeworld.cluster.dra import API_TOKEN, DraCluster, eventually
from tests.kubeworld.scheduler.allocator import gather_pools

CAPACITY = {"clients": Capacity("16", "1", valid_values=("1",))}


def devices(count: int, *, tainted: int | None = None) -> list[SliceDevice]:
    """``count`` devices, in the order the inventory gives them; ``tainted``: that one
    carries a taint."""
    return [
        SliceDevice(
            f"gpu-{i}",
            attributes={"index": i},
            capacity=CAPACITY,
            taints=(Taint("gpushare.io/drained", "NoSchedule"),) if i == tainted else (),
            binding_conditions=("gpushare.io/admitted",),
            binding_failure_conditions=("gpushare.io/refused",),
        )
        for i in range(count)
    ]


def publisher(kube: RestKubeApi, **options: float) -> SlicePublisher:
    return SlicePublisher(kube, driver=DRIVER, node=NODE, **options)


async def published(kube: RestKubeApi) -> SlicePublisher:
    """A publisher that has written a pool of 150 devices, three slices."""
    slices = publisher(kube)
    slices.publish(devices(150))
    await slices.sync_once()
    return slices


def pool(api: FakeApiServer) -> dict[str, Any]:
    """What the scheduler makes of the node's slices: complete or not, the devices it sees
    (those of the newest generation), the generations and counts the slices name."""
    slices = api.objects("resourceslices")
    [seen] = gather_pools(slices, NODE)
    return {
        "complete": seen.complete,
        "devices": [c.device["name"] for c in seen.candidates],
        "generations": {s["spec"]["pool"]["generation"] for s in slices},
        "counts": {s["spec"]["pool"]["resourceSliceCount"] for s in slices},
        "slices": len(slices),
    }


def names(count: int) -> set[str]:
    return {f"gpu-{i}" for i in range(count)}


async def test_more_devices_than_a_slice_holds_make_one_complete_pool(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = publisher(kube)
    slices.publish(devices(150))
    assert await slices.sync_once() is True
    stored = api.objects("resourceslices")
    assert sorted(len(s["spec"]["devices"]) for s in stored) == [22, MAX_DEVICES, MAX_DEVICES]
    assert pool(api) | {"devices": set(pool(api)["devices"])} == {
        "complete": True,
        "devices": names(150),
        "generations": {1},
        "counts": {3},
        "slices": 3,
    }
    assert all(s["metadata"]["name"].startswith(f"{NODE}-{DRIVER}-") for s in stored)
    assert slices.writes == 3  # one API write per slice
    assert await slices.sync_once() is False  # an unchanged node writes nothing
    assert slices.writes == 3


async def test_a_change_moves_every_slice_of_the_pool_to_a_new_generation(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = await published(kube)
    before = {s["metadata"]["name"] for s in api.objects("resourceslices")}
    slices.publish(devices(150, tainted=140))  # one device of the last slice changes
    assert await slices.sync_once() is True
    assert pool(api)["generations"] == {2} and pool(api)["complete"]
    assert {s["metadata"]["name"] for s in api.objects("resourceslices")} == before  # replaced
    assert slices.writes == 6
    tainted = [
        d for s in api.objects("resourceslices") for d in s["spec"]["devices"] if d.get("taints")
    ]
    assert [d["name"] for d in tainted] == ["gpu-140"]


async def test_a_pool_that_shrinks_loses_its_extra_slices_and_one_that_grows_gains_them(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = await published(kube)
    slices.publish(devices(70))
    assert await slices.sync_once() is True
    assert pool(api) | {"devices": set(pool(api)["devices"])} == {
        "complete": True,
        "devices": names(70),
        "generations": {2},
        "counts": {2},
        "slices": 2,
    }
    slices.publish(devices(200))
    await slices.sync_once()
    assert (pool(api)["slices"], pool(api)["counts"], pool(api)["generations"]) == (4, {4}, {3})
    assert set(pool(api)["devices"]) == names(200) and pool(api)["complete"]
    slices.publish(devices(3))
    await slices.sync_once()
    assert (pool(api)["slices"], pool(api)["counts"], pool(api)["devices"]) == (
        1,
        {1},
        ["gpu-0", "gpu-1", "gpu-2"],
    )


async def test_one_wiped_slice_of_the_pool_is_written_again(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = await published(kube)
    wiped = api.objects("resourceslices")[1]
    api.delete_object("resourceslices", "", wiped["metadata"]["name"])
    assert pool(api)["complete"] is False
    assert await slices.sync_once() is True
    assert pool(api)["complete"] and set(pool(api)["devices"]) == names(150)
    assert slices.writes == 4  # the missing slice only: the others still hold the pool


@pytest.mark.parametrize(
    ("method", "fault"),
    [
        ("POST", {"status": 500}),  # refused, after the pool's replaces
        ("POST", {"status": 500, "landed": True}),  # done, its answer lost
        ("POST", {"status": 0}),  # the connection broke
        ("PUT", {"status": 500}),  # the last slice's replace, after the others'
        ("PUT", {"status": 409, "reason": "Conflict"}),  # changed under us
        ("DELETE", {"status": 500}),  # after the writes, when the pool shrinks
    ],
)
async def test_a_write_failing_half_way_through_the_pool_ends_with_one_complete_pool(
    api: FakeApiServer, kube: RestKubeApi, method: str, fault: dict[str, Any]
) -> None:
    slices = await published(kube)
    [last] = [
        s for s in api.objects("resourceslices") if s["spec"]["devices"][-1]["name"] == "gpu-149"
    ]
    wanted = 70 if method == "DELETE" else 200
    api.fail_next(
        method,
        rf"/resourceslices/{last['metadata']['name']}" if method == "PUT" else r"/resourceslices",
        **fault,
    )
    slices.publish(devices(wanted, tainted=1))
    with pytest.raises(KubeError):
        await slices.sync_once()
    await slices.sync_once()  # the next round (the task retries with backoff)
    after = pool(api)
    assert after["complete"] and set(after["devices"]) == names(wanted)
    assert len(after["generations"]) == 1 and after["slices"] == -(-wanted // MAX_DEVICES)
    assert await slices.sync_once() is False  # and then it is at rest


async def test_a_burst_of_changes_to_a_pool_is_one_publish_event(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    slices = publisher(kube, min_interval_s=0.5, resync_s=60.0)
    task = asyncio.create_task(slices.run())
    try:
        slices.publish(devices(150))
        await asyncio.wait_for(slices.synced.wait(), 5)
        for i in range(20):
            slices.publish(devices(150, tainted=i))
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        await asyncio.wait_for(slices.synced.wait(), 5)
        assert pool(api)["generations"] == {2} and pool(api)["complete"]
        assert slices.writes == 6  # three creates, then three replaces for the burst
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


MIG_NODE = (
    """version: 1
devices:
  - model: A100-SXM4-80GB
    memory: 80GiB
    count: 10
    mig:
"""
    + "      - {profile: 1g.10gb, memory: 10GiB}\n" * 7
)


async def test_a_sim_agent_with_70_mig_instances_stays_up_and_publishes_them_all(
    root: Path,
) -> None:
    """10 GPUs of 7 MIG instances each: 70 devices, two slices of one complete pool."""
    (root / "node.yaml").write_text(MIG_NODE)
    async with FakeApiServer(token=API_TOKEN) as server:
        kube = RestKubeApi.from_url(server.url, token=API_TOKEN)
        cluster = DraCluster(server, root, kube)
        node = cluster.add_node(0, {"sim.node_file": root / "node.yaml"})
        await node.kubelet.start()
        node.start()
        try:
            await node.wait_ready(90)

            def published() -> bool:
                assert node.process is not None and node.process.poll() is None, node.log_text()[
                    -3000:
                ]
                seen = gather_pools(cluster.slices(node.name), node.name)
                return bool(seen) and seen[0].complete and len(seen[0].candidates) == 70

            await eventually(published, 60)
            await asyncio.sleep(1.0)  # and it stays up
            assert published()
            stored = cluster.slices(node.name)
            assert sorted(len(s["spec"]["devices"]) for s in stored) == [6, MAX_DEVICES]
            names = {d["name"] for s in stored for d in s["spec"]["devices"]}
            assert names == {f"gpu-{g}-mig-{i}" for g in range(10) for i in range(1, 8)}
        finally:
            node.stop()
            await node.kubelet.stop()
            await kube.aclose()
