"""The services the kubelet calls on the driver's socket: ``DRAPlugin`` (``v1`` and, for
kubelets 1.33-1.34, ``v1beta1``: the same messages) and ``DRAResourceHealth`` (``v1``
and ``v1alpha1``, which kubelets up to 1.39 still read).

Prepare and Unprepare answer every claim of the request, each with its own error text:
one claim the driver cannot serve never fails the others, and an error of the driver
itself becomes an error on each claim (logged here) rather than a failed call. A claim
whose reference is not a Kubernetes object's (``claim_fault``) is answered with why and
never reaches the driver. The health stream sends the whole device list at once, again
on every change and at least every ``resend_s`` (the kubelet turns a device it has not
heard of within its timeout to Unknown).

Requests are decoded in the handlers, not by gRPC: one that is not the method's message
(not protobuf, a string not UTF-8) is INVALID_ARGUMENT, with one log line and no
traceback. What a caller sends reaches a log line only escaped and cut."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

import grpc
import grpc.aio
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from agent.api.dra_metrics import LatencyHistogram
from agent.core.logsafe import escaped
from agent.dra.port import ClaimRef, DeviceHealth, Driver, Prepared, PreparedDevice, claim_fault
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


def checked(claims: Iterable[ClaimRef], call: str) -> tuple[list[ClaimRef], dict[str, str]]:
    """The claims the driver may see, and the others' errors by UID (each logged)."""
    good: list[ClaimRef] = []
    refused: dict[str, str] = {}
    for claim in claims:
        fault = claim_fault(claim)
        if fault:
            log.warning("%s: claim %s refused: %s", call, claim, fault)
            refused[claim.uid] = fault
        else:
            good.append(claim)
    return good, refused


def prepare_response(pb: ModuleType, uids: Iterable[str], answers: Mapping[str, Prepared]) -> Any:
    out = {}
    for uid in uids:
        answer = answers.get(uid) or Prepared(error="the driver gave no answer")
        out[uid] = pb.NodePrepareResourceResponse(
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


def unprepare_response(pb: ModuleType, uids: Iterable[str], errors: Mapping[str, str]) -> Any:
    out = {
        uid: pb.NodeUnprepareResourceResponse(error=errors.get(uid, "the driver gave no answer"))
        for uid in uids
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
        self.prepare_latency = LatencyHistogram()  # each call, request to answer

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
        """An answer per claim (none asked: the liveness probe of some drivers), its time
        observed in ``prepare_latency``."""
        started_s = time.perf_counter()
        claims, refused = checked(claim_refs(request), "NodePrepareResources")
        self.prepares += 1
        answers = {
            **await self._prepare(claims),
            **{uid: Prepared(error=error) for uid, error in refused.items()},
        }
        response = prepare_response(pb, [*(c.uid for c in claims), *refused], answers)
        self.prepare_latency.observe(time.perf_counter() - started_s)
        return response

    async def unprepare(self, pb: ModuleType, request: Any) -> Any:
        claims, refused = checked(claim_refs(request), "NodeUnprepareResources")
        errors = {**await self._unprepare(claims), **refused}
        return unprepare_response(pb, [*(c.uid for c in claims), *refused], errors)

    async def _prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Prepared]:
        if not claims:
            return {}
        try:
            return await self._driver.prepare(claims)
        except Exception:
            log.exception("NodePrepareResources %s failed", [str(c) for c in claims])
            error = DRIVER_FAILED.format(what="prepare")
            return {c.uid: Prepared(error=error) for c in claims}

    async def _unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        if not claims:
            return {}
        try:
            return await self._driver.unprepare(claims)
        except Exception:
            log.exception("NodeUnprepareResources %s failed", [str(c) for c in claims])
            return {c.uid: DRIVER_FAILED.format(what="unprepare") for c in claims}

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
    add_servicer(server, dra_v1_pb2, "DRAPlugin", PluginV1(service))
    add_servicer(server, dra_v1beta1_pb2, "DRAPlugin", PluginV1beta1(service))
    add_servicer(server, health_v1_pb2, "DRAResourceHealth", HealthV1(service))
    add_servicer(server, health_v1alpha1_pb2, "DRAResourceHealth", HealthV1alpha1(service))


# -- requests decoded in the handlers -------------------------------------------------------


def add_servicer(server: grpc.aio.Server, pb: ModuleType, service: str, servicer: object) -> None:
    """Serve ``servicer``'s methods of ``pb``'s ``service`` (the generated code's names),
    each request decoded in its handler: gRPC's own decoding answers a request it cannot
    decode with UNKNOWN and logs a traceback."""
    descriptor = pb.DESCRIPTOR.services_by_name[service]
    handlers = {m.name: method_handler(m, getattr(servicer, m.name)) for m in descriptor.methods}
    generic = grpc.method_handlers_generic_handler(descriptor.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))


def method_handler(
    method: MethodDescriptor, call: Callable[..., Any]
) -> grpc.RpcMethodHandler[Any, Any]:
    if method.client_streaming:
        raise ValueError(f"{method.full_name}: client streaming is not served")
    request_type = GetMessageClass(method.input_type)
    serialize = GetMessageClass(method.output_type).SerializeToString
    if method.server_streaming:
        return grpc.unary_stream_rpc_method_handler(
            _streaming(request_type, call), response_serializer=serialize
        )
    return grpc.unary_unary_rpc_method_handler(
        _unary(request_type, call), response_serializer=serialize
    )


def _unary(request_type: type[Message], call: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(raw: bytes, context: Context) -> Any:
        return await call(await decoded(request_type, raw, context), context)

    return handle


def _streaming(request_type: type[Message], call: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(raw: bytes, context: Context) -> AsyncIterator[Any]:
        async for message in call(await decoded(request_type, raw, context), context):
            yield message

    return handle


async def decoded(request_type: type[Message], raw: bytes, context: Context) -> Message:
    """``raw`` as a ``request_type``, or the call ends with INVALID_ARGUMENT."""
    request = request_type()
    try:
        request.ParseFromString(raw)
    except (DecodeError, UnicodeDecodeError) as exc:
        name = request_type.DESCRIPTOR.full_name
        why = escaped(str(exc), 200)
        log.warning("a request that is not a %s was refused: %s", name, why)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a valid {name}: {why}")
    return request
