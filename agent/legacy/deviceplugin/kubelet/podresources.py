"""A client of the kubelet's PodResources API (``v1.PodResourcesLister``): which devices of
one resource the kubelet gave to which container of which pod."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from agent.legacy.deviceplugin.kubelet.port import DEFAULT_RESOURCE_NAME
from agent.legacy.deviceplugin.kubelet.proto import podresources_pb2 as pb
from agent.legacy.deviceplugin.kubelet.proto import podresources_pb2_grpc as pb_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # what the kubelet allows itself for these answers


class PodResourcesError(Exception):
    """The kubelet's PodResources API could not be asked, or answered with an error."""


@dataclass(frozen=True)
class AssignedDevices:
    """The ids of one resource the kubelet assigned to one container."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


class PodResourcesClient:
    """``list()`` asks the kubelet once, over a connection of its own, for what it has
    assigned of ``resource_name``; containers without any are left out."""

    def __init__(
        self,
        socket: str | os.PathLike[str] = DEFAULT_SOCKET,
        *,
        resource_name: str = DEFAULT_RESOURCE_NAME,
        timeout_s: float = 5.0,
    ) -> None:
        self.socket = Path(socket)
        self.resource_name = resource_name
        self._timeout_s = timeout_s

    async def list(self) -> list[AssignedDevices]:
        if not self.socket.exists():
            raise PodResourcesError(
                f"the kubelet's PodResources socket {self.socket} does not exist "
                "(is the kubelet running, and its pod-resources directory mounted?)"
            )
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        try:
            async with grpc.aio.insecure_channel(
                f"unix://{self.socket}", options=options
            ) as channel:
                stub = pb_grpc.PodResourcesListerStub(channel)
                response: pb.ListPodResourcesResponse = await stub.List(
                    pb.ListPodResourcesRequest(), timeout=self._timeout_s
                )
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(
                f"PodResources List on {self.socket} failed: {exc.code().name}: {exc.details()}"
            ) from exc
        return assigned(response, self.resource_name)


def assigned(response: pb.ListPodResourcesResponse, resource_name: str) -> list[AssignedDevices]:
    """The assignments of ``resource_name`` in a List answer, in the kubelet's order."""
    return [
        AssignedDevices(
            namespace=pod.namespace,
            pod=pod.name,
            container=container.name,
            resource_name=devices.resource_name,
            device_ids=tuple(devices.device_ids),
        )
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        if devices.resource_name == resource_name and devices.device_ids
    ]
