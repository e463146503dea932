"""The ``v1beta1.DevicePlugin`` service the kubelet calls: the advertised ids, a preferred
allocation, Allocate and PreStartContainer answered by the :class:`Allocator`.

A refusal (:class:`AllocationRefused`) is FAILED_PRECONDITION with its message, which the
kubelet shows in the pod's events; any other error of the allocator is logged here and is
INTERNAL to the kubelet.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio

from agent.legacy.deviceplugin.kubelet.port import AllocationRefused, Allocator, ContainerAllocation
from agent.legacy.deviceplugin.kubelet.proto import deviceplugin_pb2 as pb
from agent.legacy.deviceplugin.kubelet.proto import deviceplugin_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

HEALTHY = "Healthy"  # the kubelet's constants (v1beta1 constants.go)
UNHEALTHY = "Unhealthy"
Context = grpc.aio.ServicerContext[Any, Any]
T = TypeVar("T")
_DIGITS = re.compile(r"(\d+)")


def plugin_options() -> pb.DevicePluginOptions:
    return pb.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


@functools.lru_cache(maxsize=4096)  # the ids are the plugin's own few hundred
def natural_key(device_id: str) -> tuple[tuple[str | int, ...], str]:
    """Sort key that puts ``share-2`` before ``share-10``: runs of digits compare as
    numbers (text and number runs alternate, so equal positions hold equal types)."""
    parts = _DIGITS.split(device_id)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), device_id


def preferred(available: Iterable[str], must_include: Iterable[str], size: int) -> list[str]:
    """The ids ``must_include`` first, then the lowest-numbered other available ids, up to
    ``size`` in all (fewer when not enough are available)."""
    chosen = list(dict.fromkeys(must_include))
    taken = set(chosen)
    wanted = max(0, size - len(chosen))
    rest = heapq.nsmallest(wanted, {d for d in available if d not in taken}, key=natural_key)
    return chosen + rest


def container_response(allocation: ContainerAllocation) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ],
        devices=[
            pb.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in allocation.devices
        ],
        annotations=dict(allocation.annotations),
        cdi_devices=[pb.CDIDevice(name=name) for name in allocation.cdi_devices],
    )


class DevicePluginService(pb_grpc.DevicePluginServicer):
    """The handlers of one serving plugin socket. ``devices_changed`` makes every open
    ListAndWatch stream send the current list again; ``close`` ends those streams."""

    def __init__(self, allocator: Allocator, resource_name: str) -> None:
        self._allocator = allocator
        self._resource_name = resource_name
        self._watchers: set[asyncio.Event] = set()
        self._closed = False

    @property
    def watchers(self) -> int:
        """How many ListAndWatch streams are open."""
        return len(self._watchers)

    def devices_changed(self) -> None:
        for event in self._watchers:
            event.set()

    def close(self) -> None:
        self._closed = True
        self.devices_changed()

    def device_list(self) -> pb.ListAndWatchResponse:
        try:
            ids: Sequence[str] = list(self._allocator.device_ids())
        except Exception:
            log.exception("%s: listing the devices failed; advertising none", self._resource_name)
            ids = []
        return pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=HEALTHY) for i in ids])

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Context) -> Any:
        return plugin_options()

    async def ListAndWatch(
        self, request: pb.Empty, context: Context
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        event = asyncio.Event()
        self._watchers.add(event)
        try:
            while not self._closed:
                event.clear()  # before reading the list: a change while sending is not lost
                yield self.device_list()
                await event.wait()
        finally:
            self._watchers.discard(event)

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Context
    ) -> Any:
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=preferred(
                        r.available_deviceIDs, r.must_include_deviceIDs, r.allocation_size
                    )
                )
                for r in request.container_requests
            ]
        )

    async def Allocate(self, request: pb.AllocateRequest, context: Context) -> Any:
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            allocation = await self._answer(
                context, "Allocate", ids, functools.partial(self._allocator.allocate, ids)
            )
            responses.append(container_response(allocation))
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Context
    ) -> Any:
        ids = list(request.devices_ids)
        await self._answer(
            context, "PreStartContainer", ids, lambda: self._allocator.pre_start(ids)
        )
        return pb.PreStartContainerResponse()

    async def _answer(
        self, context: Context, rpc: str, ids: Sequence[str], call: Callable[[], Awaitable[T]]
    ) -> T:
        try:
            return await call()
        except AllocationRefused as exc:
            message = str(exc) or f"{self._resource_name}: allocation refused"
            log.warning("%s %s %s refused: %s", self._resource_name, rpc, list(ids), message)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
        except Exception:
            log.exception("%s %s %s failed", self._resource_name, rpc, list(ids))
            await context.abort(
                grpc.StatusCode.INTERNAL, f"{rpc} failed in the gpushare agent; see its log"
            )
        raise AssertionError("abort returns by raising")
