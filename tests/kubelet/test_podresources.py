"""The PodResources client against the fake kubelet's List."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.legacy.deviceplugin.kubelet.plugin import DevicePluginServer
from agent.legacy.deviceplugin.kubelet.podresources import (
    AssignedDevices,
    PodResourcesClient,
    PodResourcesError,
)
from tests.kubelet.recording import RecordingAllocator
from tests.kubeworld.kubelet.device_plugin import FakeKubelet


async def test_list_reports_what_the_kubelet_assigned(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    a = await kubelet.allocate("team-a", "train-1", "main", 2)
    b = await kubelet.allocate("team-b", "serve-1", "sidecar", 1)
    kubelet.record("team-b", "serve-1", "main", "nvidia.com/gpu", ["GPU-1"])  # not ours
    client = PodResourcesClient(kubelet.pod_resources_socket)
    assert await client.list() == [
        AssignedDevices("team-a", "train-1", "main", "gpushare.io/share", tuple(a.device_ids)),
        AssignedDevices("team-b", "serve-1", "sidecar", "gpushare.io/share", tuple(b.device_ids)),
    ]
    assert set(a.device_ids).isdisjoint(b.device_ids)
    kubelet.release("team-a", "train-1")
    assert [r.pod for r in await client.list()] == ["serve-1"]
    other = PodResourcesClient(kubelet.pod_resources_socket, resource_name="nvidia.com/gpu")
    assert await other.list() == [
        AssignedDevices("team-b", "serve-1", "main", "nvidia.com/gpu", ("GPU-1",))
    ]


async def test_a_refused_allocation_is_not_listed(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    allocator.refuse_allocate = "no lease"
    await kubelet.allocate("team-a", "train-1", "main", 1)
    assert await PodResourcesClient(kubelet.pod_resources_socket).list() == []


async def test_a_missing_socket_is_a_clear_error(root: Path) -> None:
    client = PodResourcesClient(root / "pod-resources" / "kubelet.sock")
    with pytest.raises(PodResourcesError, match="does not exist"):
        await client.list()


async def test_a_kubelet_that_does_not_answer_is_an_error(root: Path) -> None:
    kubelet = FakeKubelet(root)
    await kubelet.start()
    await kubelet.stop()
    kubelet.pod_resources_socket.touch()  # a file is there; nobody serves it
    client = PodResourcesClient(kubelet.pod_resources_socket, timeout_s=2)
    with pytest.raises(PodResourcesError, match=r"PodResources List on .* failed: UNAVAILABLE"):
        await client.list()
