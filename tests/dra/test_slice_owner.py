"""The node's slices are owned by its Node object: when that object is deleted and created
again (a new UID), the garbage collector deletes every slice that names the old one, and
the slices the publisher writes next name the new Node, not the dead one (which would have
the collector delete them again and again)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.dra.publisher import SlicePublisher
from agent.dra.slices import Capacity, SliceDevice
from agent.kubeapi.rest import RestKubeApi
from tests.dra.fixtures import NODE
from tests.kubeworld.apiserver import FakeApiServer

CAPACITY = {"clients": Capacity("16", "1", valid_values=("1",))}


def devices(count: int) -> list[SliceDevice]:
    return [
        SliceDevice(f"gpu-{i}", attributes={"index": i}, capacity=CAPACITY) for i in range(count)
    ]


def collect_garbage(api: FakeApiServer) -> list[str]:
    """The garbage collector's pass over slices (the stand-in has none): a slice whose
    owner no longer exists, by UID, is deleted. The names of those deleted."""
    live = {n["metadata"]["uid"] for n in api.objects("nodes")}
    deleted = []
    for found in api.objects("resourceslices"):
        owners = found["metadata"].get("ownerReferences") or []
        if any(o["uid"] not in live for o in owners):
            api.delete_object("resourceslices", "", found["metadata"]["name"])
            deleted.append(found["metadata"]["name"])
    return deleted


def recreate_node(api: FakeApiServer) -> str:
    """The Node object deleted and registered again (a node reinstalled, or its object
    deleted by hand): the new object's UID."""
    api.delete_object("nodes", "", NODE)
    return str(api.create_node(NODE)["metadata"]["uid"])


def owners(api: FakeApiServer) -> set[str]:
    return {
        o["uid"]
        for s in api.objects("resourceslices")
        for o in s["metadata"].get("ownerReferences") or []
    }


@pytest.mark.parametrize("count", [3, 150])  # one slice, a pool of three
async def test_slices_written_after_the_node_is_created_again_name_the_new_node(
    api: FakeApiServer, kube: RestKubeApi, count: int
) -> None:
    slices = SlicePublisher(kube, driver="gpushare.io", node=NODE)
    slices.publish(devices(count))
    await slices.sync_once()
    new_uid = recreate_node(api)
    assert collect_garbage(api)  # every slice named the old Node
    assert await slices.sync_once() is True  # found gone: written again
    assert owners(api) == {new_uid}
    assert collect_garbage(api) == []  # and the collector leaves them be
    assert await slices.sync_once() is False


@pytest.mark.parametrize("collected", ["gpu-0", "gpu-149"])  # a slice that stays, or changes
async def test_slices_kept_after_the_node_is_created_again_are_written_for_the_new_node(
    api: FakeApiServer, kube: RestKubeApi, collected: str
) -> None:
    """One slice of the pool collected before the others: the slice written again names
    the new Node, and so do the others, written over before the collector gets to them."""
    slices = SlicePublisher(kube, driver="gpushare.io", node=NODE)
    slices.publish(devices(150))
    await slices.sync_once()
    new_uid = recreate_node(api)
    [first] = [s for s in api.objects("resourceslices") if has_device(s, collected)]
    api.delete_object("resourceslices", "", first["metadata"]["name"])
    slices.publish(devices(151))
    assert await slices.sync_once() is True
    assert owners(api) == {new_uid}
    assert collect_garbage(api) == []


def has_device(found: dict[str, Any], name: str) -> bool:
    return any(d["name"] == name for d in found["spec"]["devices"])
