"""The services the kubelet calls on the driver's socket: ``DRAPlugin`` (``v1`` and, for
kubelets 1.33-1.34, ``v1beta1``: the same messages) and ``DRAResourceHealth`` (``v1``
and ``v1alpha1``, which kubelets up to 1.39 still read).

Prepare and Unprepare answer every claim of the request, each with its own error text:
one claim the driver cannot serve never fails the others, and an error of the driver
itself becomes an error on each claim (logged here) rather than a failed call. The
health stream sends the whole device list at once, again on every change and at least
every ``resend_s`` (the kubelet turns a device it has not heard of within its timeout
to Unknown)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import grpc
import grpc.aio

from agent.dra.port import ClaimRef, DeviceHealth, Driver, Prepared, PreparedDevice
from agent.dra.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
HEALTH_MESSAGE_CHARS = 1024
DRIVER_FAILED = "the gpushare agent failed to {what} this claim; see its log"


def claim_refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]


def prepare_response(
    pb: ModuleType, claims: Sequence[ClaimRef], answers: Mapping[str, Prepared]
) -> Any:
    out = {}
    for claim in claims:
        answer = answers.get(claim.uid) or Prepared(error="the driver gave no answer")
        out[claim.uid] = pb.NodePrepareResourceResponse(
            devices=[device_message(pb, d) for d in answer.devices], error=answer.error
        )
    return pb.NodePrepareResourcesResponse(claims=out)


def device_message(pb: ModuleType, device: PreparedDevice) -> Any:
    """A prepared device; its share id only where the version has the field (v1 does,
    v1beta1 does not: kubelets before 1.34 do not know shares)."""
    fields: dict[str, Any] = {
        "request_names": list(device.request_names),
        "pool_name": device.pool_name,
        "device_name": device.device_name,
        "cdi_device_ids": list(device.cdi_device_ids),
    }
    if device.share_id and "share_id" in pb.Device.DESCRIPTOR.fields_by_name:
        fields["share_id"] = device.share_id
    return pb.Device(**fields)


def unprepare_response(
    pb: ModuleType, claims: Sequence[ClaimRef], errors: Mapping[str, str]
) -> Any:
    out = {
        c.uid: pb.NodeUnprepareResourceResponse(
            error=errors.get(c.uid, "the driver gave no answer")
        )
        for c in claims
    }
    return pb.NodeUnprepareResourcesResponse(claims=out)


class DraService:
    """The driver's handlers, whatever the version of the kubelet that calls."""

    def __init__(self, driver: Driver, *, resend_s: float = 10.0, timeout_s: int = 30) -> None:
        self._driver = driver
        self._resend_s = resend_s
        self._timeout_s = timeout_s
        self._watchers: set[asyncio.Event] = set()
        self._closed = False
        self.prepares = 0  # calls, for the metrics and the tests

    @property
    def health_watchers(self) -> int:
        return len(self._watchers)

    def health_changed(self) -> None:
        for event in self._watchers:
            event.set()

    def close(self) -> None:
        self._closed = True
        self.health_changed()

    async def prepare(self, pb: ModuleType, request: Any) -> Any:
        claims = claim_refs(request)
        self.prepares += 1
        if not claims:  # the liveness probe of some drivers: nothing to do
            return pb.NodePrepareResourcesResponse()
        try:
            answers = await self._driver.prepare(claims)
        except Exception:
            log.exception("NodePrepareResources %s failed", [str(c) for c in claims])
            error = DRIVER_FAILED.format(what="prepare")
            answers = {c.uid: Prepared(error=error) for c in claims}
        return prepare_response(pb, claims, answers)

    async def unprepare(self, pb: ModuleType, request: Any) -> Any:
        claims = claim_refs(request)
        if not claims:
            return pb.NodeUnprepareResourcesResponse()
        try:
            errors = await self._driver.unprepare(claims)
        except Exception:
            log.exception("NodeUnprepareResources %s failed", [str(c) for c in claims])
            errors = {c.uid: DRIVER_FAILED.format(what="unprepare") for c in claims}
        return unprepare_response(pb, claims, errors)

    def health_message(self, pb: ModuleType) -> Any:
        try:
            devices: Sequence[DeviceHealth] = list(self._driver.health())
        except Exception:
            log.exception("reading the devices' health failed; sending none")
            devices = []
        now = int(time.time())
        return pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=d.pool_name, device_name=d.device_name),
                    health=int(d.health),
                    last_updated_time=now,
                    health_check_timeout_seconds=self._timeout_s,
                    message=d.message[:HEALTH_MESSAGE_CHARS],
                )
                for d in devices
            ]
        )

    async def watch_health(self, pb: ModuleType) -> AsyncIterator[Any]:
        event = asyncio.Event()
        self._watchers.add(event)
        try:
            while not self._closed:
                event.clear()  # before reading: a change while sending is not lost
                yield self.health_message(pb)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), self._resend_s)
        finally:
            self._watchers.discard(event)


class PluginV1(dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodePrepareResources(self, request: Any, context: Context) -> Any:
        return await self._service.prepare(dra_v1_pb2, request)

    async def NodeUnprepareResources(self, request: Any, context: Context) -> Any:
        return await self._service.unprepare(dra_v1_pb2, request)


class PluginV1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodePrepareResources(self, request: Any, context: Context) -> Any:
        return await self._service.prepare(dra_v1beta1_pb2, request)

    async def NodeUnprepareResources(self, request: Any, context: Context) -> Any:
        return await self._service.unprepare(dra_v1beta1_pb2, request)


class HealthV1(health_v1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodeWatchResources(self, request: Any, context: Context) -> AsyncIterator[Any]:
        async for message in self._service.watch_health(health_v1_pb2):
            yield message


class HealthV1alpha1(health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodeWatchResources(self, request: Any, context: Context) -> AsyncIterator[Any]:
        async for message in self._service.watch_health(health_v1alpha1_pb2):
            yield message


def add_services(server: grpc.aio.Server, service: DraService) -> None:
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(PluginV1(service), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(PluginV1beta1(service), server)
    health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1(service), server)
    health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        HealthV1alpha1(service), server
    )
