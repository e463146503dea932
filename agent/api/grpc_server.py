"""The gRPC servers: ``gpushare.v1.Agent``, health and reflection.

Two listeners, two servers over one node: the Unix socket for the local CLI (mode 0660,
admin RPCs allowed) and, optionally, TCP for the scheduler (a bearer token checked in
constant time, or mutual TLS; admin RPCs answer PERMISSION_DENIED). Errors of the agent's
tree become status codes here and only here; anything else is INTERNAL and logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection

from agent.api import convert, validate
from agent.api.auth import ReloadableTls, TokenHolder, TokenInterceptor, reload_all
from agent.api.ports import EventFeed, NodeApi
from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.api.registration import add_agent_service
from agent.core.errors import (
    AlreadyExistsError,
    ConflictError,
    GpushareError,
    LeaseTransitionError,
    NotFoundError,
    StateError,
    UnitError,
    ValidationError,
)
from agent.core.lease import Lease
from agent.core.types import AdmitResult, Event

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Agent"].full_name
SOCKET_MODE = 0o660
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
WATCH_PAGE = 500  # events a watcher reads at a time
WATCH_MAX_LAG = 10_000  # a live watcher's bounded send queue, in events
CATCHUP_STREAMS = 4  # watchers reading a page from the store at a time
ENCODED_KEPT = 20_000  # serialized events kept for the watchers
STATUS = {
    AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    LeaseTransitionError: grpc.StatusCode.INTERNAL,  # a bug: never retry it
    ValidationError: grpc.StatusCode.INVALID_ARGUMENT,
    UnitError: grpc.StatusCode.INVALID_ARGUMENT,
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    ConflictError: grpc.StatusCode.FAILED_PRECONDITION,
    StateError: grpc.StatusCode.UNAVAILABLE,
}
Context = grpc.aio.ServicerContext[Any, Any]
T = TypeVar("T")


def status_of(exc: GpushareError) -> grpc.StatusCode:
    return next(
        (c for cls, c in STATUS.items() if isinstance(exc, cls)), grpc.StatusCode.UNAVAILABLE
    )


async def answer(context: Context, call: Callable[[], Awaitable[T]]) -> T:
    """Run a handler body, mapping the agent's errors to gRPC status codes."""
    try:
        return await call()
    except GpushareError as exc:
        await context.abort(status_of(exc), str(exc))
    except Exception:
        log.exception("internal error in %s", context)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the agent log")
    raise AssertionError("abort returns by raising")


class EncodedEvents:
    """Events serialized once, for every watcher that sends them (bounded, newest kept)."""

    def __init__(self) -> None:
        self._by_seq: OrderedDict[int, bytes] = OrderedDict()

    def encode(self, event: Event) -> bytes:
        data = self._by_seq.get(event.seq)
        if data is None:
            data = convert.event_to_pb(event).SerializeToString()
            self._by_seq[event.seq] = data
            if len(self._by_seq) > ENCODED_KEPT:
                self._by_seq.popitem(last=False)
        return data


class AgentService(pb_grpc.AgentServicer):
    def __init__(self, node: NodeApi, events: EventFeed, *, admin: bool, max_batch: int) -> None:
        self._node = node
        self._events = events
        self._admin = admin
        self._max_batch = max_batch
        self._wire = EncodedEvents()
        self._catching_up = asyncio.Semaphore(CATCHUP_STREAMS)

    async def _admin_only(self, context: Context, name: str) -> None:
        if not self._admin:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{name} is allowed only on the agent's local Unix socket",
            )

    def _result(self, result: AdmitResult) -> pb.AdmitResponse:
        index = self._node.device_index(result.lease.device_uuid) if result.lease else 0
        response = convert.result_to_pb(result, index)
        if result.error is not None:
            response.error_code = status_of(result.error).name
            response.error_message = str(result.error)
        return response

    def _lease(self, lease: Lease) -> pb.Lease:
        return convert.lease_to_pb(lease, self._node.device_index(lease.device_uuid))

    async def Ping(self, request: pb.PingRequest, context: Context) -> pb.PingResponse:
        return pb.PingResponse()

    async def GetNode(self, request: pb.GetNodeRequest, context: Context) -> pb.GetNodeResponse:
        async def run() -> pb.GetNodeResponse:
            return convert.snapshot_to_pb(self._node.snapshot())

        return await answer(context, run)

    async def Admit(self, request: pb.AdmitRequest, context: Context) -> pb.AdmitResponse:
        async def run() -> pb.AdmitResponse:
            result = await self._node.admit(validate.request(request.request))
            return self._result(result)

        return await answer(context, run)

    async def Explain(self, request: pb.AdmitRequest, context: Context) -> pb.AdmitResponse:
        async def run() -> pb.AdmitResponse:
            return convert.result_to_pb(await self._node.explain(validate.request(request.request)))

        return await answer(context, run)

    async def AdmitBatch(
        self, request: pb.AdmitBatchRequest, context: Context
    ) -> pb.AdmitBatchResponse:
        async def run() -> pb.AdmitBatchResponse:
            if len(request.requests) > self._max_batch:
                raise ValidationError("requests", f"holds more than {self._max_batch} requests")
            requests = [
                validate.request(r, field=f"requests[{i}]") for i, r in enumerate(request.requests)
            ]
            if len({r.request_id for r in requests}) != len(requests):
                raise ValidationError("requests", "request ids must be unique in a batch")
            batch = await self._node.admit_batch(requests)
            return pb.AdmitBatchResponse(
                results=[self._result(r) for r in batch.results],
                order=batch.order,
                ready_probability=batch.ready_probability,
                ordered_by=batch.ordered_by,
            )

        return await answer(context, run)

    async def Reserve(self, request: pb.ReserveRequest, context: Context) -> pb.AdmitResponse:
        async def run() -> pb.AdmitResponse:
            gang = validate.identifier(request.gang_id, "gang_id")
            result = await self._node.admit(
                validate.request(request.request), gang_id=gang, ttl_s=validate.ttl(request.ttl_s)
            )
            return self._result(result)

        return await answer(context, run)

    async def Commit(self, request: pb.GangRequest, context: Context) -> pb.GangResponse:
        async def run() -> pb.GangResponse:
            leases = await self._node.commit(validate.identifier(request.gang_id, "gang_id"))
            return pb.GangResponse(leases=[self._lease(x) for x in leases])

        return await answer(context, run)

    async def Abort(self, request: pb.GangRequest, context: Context) -> pb.GangResponse:
        async def run() -> pb.GangResponse:
            leases = await self._node.abort(validate.identifier(request.gang_id, "gang_id"))
            return pb.GangResponse(leases=[self._lease(x) for x in leases])

        return await answer(context, run)

    async def Release(self, request: pb.ReleaseRequest, context: Context) -> pb.ReleaseResponse:
        async def run() -> pb.ReleaseResponse:
            lease = await self._node.release(validate.identifier(request.lease_id, "lease_id"))
            return pb.ReleaseResponse(lease=self._lease(lease))

        return await answer(context, run)

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: Context
    ) -> AsyncIterator[pb.Event]:
        """Catch up in pages (from the store's reader while behind the ring, a few
        watchers at a time), then follow the ring, woken once per published batch. Each
        event is serialized once for every watcher. A live watcher more than
        ``WATCH_MAX_LAG`` events behind is ended with RESOURCE_EXHAUSTED, naming where to
        resume."""
        last = request.since_seq
        if last > self._events.last_seq:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"since_seq {last} is beyond the last event ({self._events.last_seq})",
            )
        last = max(last, await self._events.first_stored_seq() - 1)
        await context.send_initial_metadata((("gpushare-first-seq", str(last + 1)),))
        live = False
        while True:
            change = self._events.change()
            if last + 1 < self._events.oldest_seq:
                live = False
                async with self._catching_up:
                    for event in await self._events.stored_since(last, limit=WATCH_PAGE):
                        last = event.seq
                        yield self._wire.encode(event)  # type: ignore[misc]
                continue
            if live and self._events.last_seq - last > WATCH_MAX_LAG:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"this watcher fell {self._events.last_seq - last} events behind; "
                    f"resume with since_seq={last}",
                )
            live = True
            page = self._events.since(last, limit=WATCH_PAGE)
            if not page:
                await change.wait()
            for event in page:
                last = event.seq
                yield self._wire.encode(event)  # type: ignore[misc]

    async def Drain(self, request: pb.DrainRequest, context: Context) -> pb.DrainResponse:
        await self._admin_only(context, "Drain")

        async def run() -> pb.DrainResponse:
            reason = validate.text(request.reason, "reason")
            return pb.DrainResponse(devices=await self._node.drain(request.device_uuid, reason))

        return await answer(context, run)

    async def Undrain(self, request: pb.DrainRequest, context: Context) -> pb.DrainResponse:
        await self._admin_only(context, "Undrain")

        async def run() -> pb.DrainResponse:
            return pb.DrainResponse(devices=await self._node.undrain(request.device_uuid))

        return await answer(context, run)

    async def ClearStale(
        self, request: pb.ClearStaleRequest, context: Context
    ) -> pb.ClearStaleResponse:
        await self._admin_only(context, "ClearStale")

        async def run() -> pb.ClearStaleResponse:
            actions = await self._node.clear_stale(dry_run=request.dry_run)
            return pb.ClearStaleResponse(actions=actions, dry_run=request.dry_run)

        return await answer(context, run)


class GrpcServer:
    """One grpc.aio server on one listener. ``start`` binds; ``stop`` drains within a grace;
    ``reload`` re-reads its token and certificates (new calls and handshakes use them)."""

    def __init__(
        self,
        service: AgentService,
        *,
        address: str,
        key: str,
        token: TokenHolder | None = None,
        tls: ReloadableTls | None = None,
    ) -> None:
        self._service = service
        self._address = address
        self._key = key
        self._token = token
        self._tls = tls
        self._server: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()
        self.port: int | None = None

    async def start(self) -> None:
        interceptors = [TokenInterceptor(self._token)] if self._token else []
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        add_agent_service(self._service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        self.port = self._bind(server)
        await server.start()
        if self._address.startswith("unix:"):
            os.chmod(self._address.removeprefix("unix:"), SOCKET_MODE)  # belt and braces
        serving = health_pb2.HealthCheckResponse.SERVING
        await self._health.set("", serving)
        await self._health.set(SERVICE_NAME, serving)
        self._server = server
        log.info("gRPC serving on %s (%s)", self._bound(), self._auth_name())
        if not self._address.startswith("unix:") and self._tls is None:
            log.warning(
                "api.insecure_loopback: %s takes a bearer token over PLAINTEXT (development "
                "only; use TLS: api.tls_cert_file, api.tls_key_file)",
                self._bound(),
            )

    def _bind(self, server: grpc.aio.Server) -> int:
        """Bind the listener; a Unix socket is created with its final mode (the umask is
        narrowed around the bind, so it is never wider than SOCKET_MODE)."""
        unix = self._address.startswith("unix:")
        previous = os.umask(0o777 & ~SOCKET_MODE) if unix else None
        try:
            if self._tls is not None:
                return server.add_secure_port(self._address, self._tls.credentials())
            return server.add_insecure_port(self._address)
        except RuntimeError as exc:
            raise GpushareError(
                f"cannot serve gRPC on {self._address}: {exc} (see {self._key})"
            ) from exc
        finally:
            if previous is not None:
                os.umask(previous)

    def _bound(self) -> str:
        if self._address.startswith("unix:"):
            return self._address
        return f"{self._address.rpartition(':')[0]}:{self.port}"

    def _auth_name(self) -> str:
        if self._address.startswith("unix:"):
            return "local socket"
        tls = self._tls
        if tls is not None and tls.files.mutual:
            return "mutual TLS" + (" and token" if self._token else "")
        if tls is not None:
            return "server TLS and token"
        return "PLAINTEXT token on loopback"

    def reload(self) -> list[str]:
        """Re-read the token and certificates; the problems of what could not be reloaded
        (that part keeps its old material)."""
        parts: list[TokenHolder | ReloadableTls] = [p for p in (self._token, self._tls) if p]
        return reload_all(parts)

    async def stop(self, grace_s: float) -> None:
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)
        self._server = None
