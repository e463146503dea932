"""The device plugin as the kubelet sees it: registration, ListAndWatch, Allocate and
PreStartContainer, through the fake kubelet over the real gRPC APIs."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from agent.legacy.deviceplugin.kubelet.plugin import DevicePluginServer
from agent.legacy.deviceplugin.kubelet.proto import deviceplugin_pb2 as dp
from agent.legacy.deviceplugin.kubelet.proto import deviceplugin_pb2_grpc as dp_grpc
from tests.kubelet.recording import RecordingAllocator
from tests.kubeworld.kubelet.device_plugin import HEALTHY, FakeKubelet


async def test_registers_with_the_kubelet_as_the_api_asks(
    kubelet: FakeKubelet, plugin: DevicePluginServer
) -> None:
    [request] = kubelet.register_requests
    assert request.version == "v1beta1"
    assert request.endpoint == "gpushare.sock"
    assert request.resource_name == "gpushare.io/share"
    assert request.options.pre_start_required
    assert request.options.get_preferred_allocation_available
    options = kubelet.plugins["gpushare.io/share"].options  # from GetDevicePluginOptions
    assert options.pre_start_required
    assert options.get_preferred_allocation_available
    assert plugin.registered
    assert plugin.socket_path == kubelet.plugin_dir / "gpushare.sock"


async def test_the_kubelet_sees_the_advertised_ids_all_healthy(
    kubelet: FakeKubelet, plugin: DevicePluginServer
) -> None:
    assert kubelet.devices() == dict.fromkeys(["share-0", "share-1", "share-2", "share-3"], HEALTHY)


async def test_devices_changed_sends_the_new_list(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    updates = kubelet.plugins["gpushare.io/share"].updates
    allocator.ids = ["share-0", "share-1"]
    await asyncio.sleep(0.1)
    assert kubelet.plugins["gpushare.io/share"].updates == updates, "sent without a change"
    assert len(kubelet.devices()) == 4
    plugin.devices_changed()
    await kubelet.wait_for(lambda: list(kubelet.devices()) == ["share-0", "share-1"])
    allocator.ids = ["share-0", "share-1", "share-7"]
    plugin.devices_changed()
    await kubelet.wait_for(lambda: list(kubelet.devices()) == ["share-0", "share-1", "share-7"])


async def test_devices_changed_reaches_every_open_stream(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    async with grpc.aio.insecure_channel(f"unix://{plugin.socket_path}") as channel:
        stream = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
        first = await stream.read()
        assert [d.ID for d in first.devices] == allocator.ids
        allocator.ids = ["share-9"]
        plugin.devices_changed()
        second = await asyncio.wait_for(stream.read(), 5)
        assert [(d.ID, d.health) for d in second.devices] == [("share-9", "Healthy")]
        await kubelet.wait_for(lambda: list(kubelet.devices()) == ["share-9"])
        stream.cancel()


async def test_allocate_answers_with_the_allocation(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    outcome = await kubelet.allocate("team-a", "train-1", "main", 1)
    assert outcome.error is None, outcome.error
    assert allocator.allocated == [outcome.device_ids]
    assert allocator.pre_started == [outcome.device_ids]  # PreStartContainer after Allocate
    answer = outcome.response
    assert answer is not None
    assert dict(answer.envs) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps",
        "GPUSHARE_LEASE": "lease-1",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in answer.mounts] == [
        ("/run/gpushare/mps", "/var/run/gpushare/mps/0", True),
        ("/dev/shm", "/var/lib/gpushare/shm", False),
    ]
    assert [(d.container_path, d.host_path, d.permissions) for d in answer.devices] == [
        ("/dev/nvidia0", "/dev/nvidia0", "rw"),
        ("/dev/nvidiactl", "/dev/nvidiactl", "rwm"),
    ]
    assert [c.name for c in answer.cdi_devices] == ["nvidia.com/gpu=GPU-0a1b"]
    assert dict(answer.annotations) == {"gpushare.io/lease": "lease-1"}


async def test_allocate_answers_each_container_request_in_order(
    plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    async with grpc.aio.insecure_channel(f"unix://{plugin.socket_path}") as channel:
        answer = await dp_grpc.DevicePluginStub(channel).Allocate(
            dp.AllocateRequest(
                container_requests=[
                    dp.ContainerAllocateRequest(devices_ids=["share-2"]),
                    dp.ContainerAllocateRequest(devices_ids=["share-0", "share-3"]),
                ]
            )
        )
    assert len(answer.container_responses) == 2
    assert allocator.allocated == [["share-2"], ["share-0", "share-3"]]


async def test_a_refused_allocate_is_failed_precondition(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    allocator.refuse_allocate = "no gpushare lease is bound to a pod on this node"
    outcome = await kubelet.allocate("team-a", "train-1", "main", 1)
    assert outcome.failed_at == "Allocate"
    assert outcome.error is not None
    assert outcome.error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert outcome.error.details() == "no gpushare lease is bound to a pod on this node"
    assert outcome.response is None
    assert allocator.pre_started == []
    assert kubelet.assignments == []  # admission failed: nothing assigned


async def test_a_refused_pre_start_is_failed_precondition(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    allocator.refuse_pre_start = "the MPS server for GPU-0a1b is not ready"
    outcome = await kubelet.allocate("team-a", "train-1", "main", 1)
    assert outcome.failed_at == "PreStartContainer"
    assert outcome.error is not None
    assert outcome.error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert outcome.error.details() == "the MPS server for GPU-0a1b is not ready"
    assert allocator.pre_started == [outcome.device_ids]


async def test_an_allocator_failure_is_internal_and_names_no_detail(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    allocator.fail_allocate = RuntimeError("secret internals")
    outcome = await kubelet.allocate("team-a", "train-1", "main", 1)
    assert outcome.error is not None
    assert outcome.error.code() == grpc.StatusCode.INTERNAL
    assert "secret internals" not in (outcome.error.details() or "")


async def test_the_kubelet_allocates_the_preferred_lowest_numbered_ids(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    allocator.ids = ["share-10", "share-3", "share-2", "share-1"]
    plugin.devices_changed()
    await kubelet.wait_for(lambda: list(kubelet.devices()) == allocator.ids)
    first = await kubelet.allocate("team-a", "a", "main", 2)
    assert first.device_ids == ["share-1", "share-2"]
    second = await kubelet.allocate("team-a", "b", "main", 1)
    assert second.device_ids == ["share-3"]
    [_, request] = kubelet.preferred_requests
    assert list(request.container_requests[0].available_deviceIDs) == ["share-10", "share-3"]
    assert allocator.allocated == [["share-1", "share-2"], ["share-3"]]


async def test_get_preferred_allocation_keeps_must_include_first(
    plugin: DevicePluginServer,
) -> None:
    async with grpc.aio.insecure_channel(f"unix://{plugin.socket_path}") as channel:
        answer = await dp_grpc.DevicePluginStub(channel).GetPreferredAllocation(
            dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=["share-10", "share-2", "share-7", "share-1"],
                        must_include_deviceIDs=["share-7"],
                        allocation_size=3,
                    ),
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=["share-5", "share-4"], allocation_size=1
                    ),
                ]
            )
        )
    assert [list(r.deviceIDs) for r in answer.container_responses] == [
        ["share-7", "share-1", "share-2"],
        ["share-4"],
    ]


async def test_pods_admitted_at_once_never_share_a_unit(
    kubelet: FakeKubelet, plugin: DevicePluginServer
) -> None:
    """The stand-in admits one pod at a time, as the kubelet does: two pods allocated at
    once (each asks the plugin's preference, which is the same lowest free id) get
    different units."""
    first, second = await asyncio.gather(
        kubelet.allocate("team-a", "p1", "main", 1), kubelet.allocate("team-a", "p2", "main", 1)
    )
    assert first.error is None and second.error is None
    assert set(first.device_ids).isdisjoint(second.device_ids)
