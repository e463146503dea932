"""The ``gpushare.v1.Agent`` service: requests validated, answers converted, errors mapped
to gRPC status codes (the servers that carry it are in :mod:`agent.api.server`).

Two listeners, two servers over one node: the Unix socket for the local CLI (mode 0660,
admin RPCs allowed) and, optionally, TCP for the scheduler (a bearer token checked in
constant time, or mutual TLS; admin RPCs answer PERMISSION_DENIED). Errors of the agent's
tree become status codes here and only here; anything else is INTERNAL and logged.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from agent.api import convert, redact, validate, watch
from agent.api.identity import Caller, Identify, local
from agent.api.ports import ClaimAnswers, EventFeed, NoClaimAnswers, NodeApi
from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.errors import (
    AlreadyExistsError,
    ConflictError,
    GpushareError,
    LeaseTransitionError,
    NotFoundError,
    PermissionDeniedError,
    StateError,
    UnitError,
    ValidationError,
)
from agent.core.lease import Lease
from agent.core.logsafe import escaped
from agent.core.types import AdmissionRequest, AdmitResult

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Agent"].full_name
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_ANSWER_MESSAGE = 1024  # characters: a binding condition's message holds no more
STATUS = {
    AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    LeaseTransitionError: grpc.StatusCode.INTERNAL,  # a bug: never retry it
    ValidationError: grpc.StatusCode.INVALID_ARGUMENT,
    UnitError: grpc.StatusCode.INVALID_ARGUMENT,
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
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


class AgentService(pb_grpc.AgentServicer):
    def __init__(
        self,
        node: NodeApi,
        events: EventFeed,
        *,
        admin: bool,
        max_batch: int,
        identify: Identify = local,
        claims: ClaimAnswers | None = None,
    ) -> None:
        self._node = node
        self._events = events
        self._claims = claims or NoClaimAnswers()
        self._admin = admin
        self._identify = identify
        self._max_batch = max_batch
        self._watchers = watch.Watchers(events)

    def close(self) -> None:
        self._watchers.close()

    async def _admin_only(self, context: Context, name: str) -> None:
        if not self._admin:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{name} is allowed only on the agent's local Unix socket",
            )

    def _result(self, result: AdmitResult, caller: Caller) -> pb.AdmitResponse:
        device = self._node.device(result.lease.device_uuid) if result.lease else None
        response = convert.result_to_pb(result, device)
        if result.error is not None:
            response.error_code = status_of(result.error).name
            response.error_message = str(result.error)
        return redact.admit_for(response, caller, self._node.owner_of)

    def _request(
        self, message: pb.Request, caller: Caller, field: str = "request"
    ) -> AdmissionRequest:
        """The validated request, owned by ``caller`` (never by what the request says)."""
        return dataclasses.replace(validate.request(message, field=field), owner=caller.name)

    def _lease(self, lease: Lease) -> pb.Lease:
        return convert.lease_to_pb(lease, self._node.device_index(lease.device_uuid))

    async def Ping(self, request: pb.PingRequest, context: Context) -> pb.PingResponse:
        return pb.PingResponse()

    async def GetNode(self, request: pb.GetNodeRequest, context: Context) -> pb.GetNodeResponse:
        caller = self._identify(context)

        async def run() -> pb.GetNodeResponse:
            snapshot = self._node.snapshot(ledger_only=request.ledger_only)
            return redact.node_for(convert.snapshot_to_pb(snapshot), caller)

        return await answer(context, run)

    async def Admit(self, request: pb.AdmitRequest, context: Context) -> pb.AdmitResponse:
        caller = self._identify(context)

        async def run() -> pb.AdmitResponse:
            result = await self._node.admit(self._request(request.request, caller))
            return self._result(result, caller)

        return await answer(context, run)

    async def Explain(self, request: pb.AdmitRequest, context: Context) -> pb.AdmitResponse:
        caller = self._identify(context)

        async def run() -> pb.AdmitResponse:
            result = await self._node.explain(self._request(request.request, caller))
            return redact.admit_for(convert.result_to_pb(result), caller, self._node.owner_of)

        return await answer(context, run)

    async def AdmitBatch(
        self, request: pb.AdmitBatchRequest, context: Context
    ) -> pb.AdmitBatchResponse:
        caller = self._identify(context)

        async def run() -> pb.AdmitBatchResponse:
            if len(request.requests) > self._max_batch:
                raise ValidationError("requests", f"holds more than {self._max_batch} requests")
            requests = [
                self._request(r, caller, f"requests[{i}]") for i, r in enumerate(request.requests)
            ]
            if len({r.request_id for r in requests}) != len(requests):
                raise ValidationError("requests", "request ids must be unique in a batch")
            batch = await self._node.admit_batch(requests)
            return pb.AdmitBatchResponse(
                results=[self._result(r, caller) for r in batch.results],
                order=batch.order,
                ready_probability=batch.ready_probability,
                ordered_by=batch.ordered_by,
            )

        return await answer(context, run)

    async def Reserve(self, request: pb.ReserveRequest, context: Context) -> pb.AdmitResponse:
        caller = self._identify(context)

        async def run() -> pb.AdmitResponse:
            gang = validate.identifier(request.gang_id, "gang_id")
            result = await self._node.admit(
                self._request(request.request, caller),
                gang_id=gang,
                ttl_s=validate.ttl(request.ttl_s),
            )
            return self._result(result, caller)

        return await answer(context, run)

    async def Commit(self, request: pb.GangRequest, context: Context) -> pb.GangResponse:
        owner = self._identify(context).owner

        async def run() -> pb.GangResponse:
            gang = validate.identifier(request.gang_id, "gang_id")
            leases = await self._node.commit(gang, owner=owner)
            return pb.GangResponse(leases=[self._lease(x) for x in leases])

        return await answer(context, run)

    async def Abort(self, request: pb.GangRequest, context: Context) -> pb.GangResponse:
        owner = self._identify(context).owner

        async def run() -> pb.GangResponse:
            gang = validate.identifier(request.gang_id, "gang_id")
            leases = await self._node.abort(gang, owner=owner)
            return pb.GangResponse(leases=[self._lease(x) for x in leases])

        return await answer(context, run)

    async def Release(self, request: pb.ReleaseRequest, context: Context) -> pb.ReleaseResponse:
        owner = self._identify(context).owner

        async def run() -> pb.ReleaseResponse:
            lease_id = validate.identifier(request.lease_id, "lease_id")
            lease = await self._node.release(lease_id, owner=owner)
            return pb.ReleaseResponse(lease=self._lease(lease))

        return await answer(context, run)

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: Context
    ) -> AsyncIterator[pb.Event]:
        """Events one by one (see agent.api.watch); other callers' lease ids are hidden from
        a caller without the observer role."""
        caller = self._identify(context)
        last = await self._watchers.begin(request.since_seq, context)
        async for page in self._watchers.pages(last, caller, context):
            for data in page.events:
                yield data  # type: ignore[misc]

    async def WatchEventBatches(
        self, request: pb.WatchEventsRequest, context: Context
    ) -> AsyncIterator[pb.EventBatch]:
        """The same events, a batch per window (``window_ms``, default 50 ms)."""
        caller = self._identify(context)
        last = await self._watchers.begin(request.since_seq, context)
        window = watch.window_s(request.window_ms)
        async for page in self._watchers.pages(last, caller, context, window):
            yield page.batch()  # type: ignore[misc]

    async def Drain(self, request: pb.DrainRequest, context: Context) -> pb.DrainResponse:
        await self._admin_only(context, "Drain")

        async def run() -> pb.DrainResponse:
            reason = validate.text(request.reason, "reason")
            device = validate.device_id(request.device_uuid)
            return pb.DrainResponse(devices=await self._node.drain(device, reason))

        return await answer(context, run)

    async def Undrain(self, request: pb.DrainRequest, context: Context) -> pb.DrainResponse:
        await self._admin_only(context, "Undrain")

        async def run() -> pb.DrainResponse:
            device = validate.device_id(request.device_uuid)
            return pb.DrainResponse(devices=await self._node.undrain(device))

        return await answer(context, run)

    async def ClearStale(
        self, request: pb.ClearStaleRequest, context: Context
    ) -> pb.ClearStaleResponse:
        await self._admin_only(context, "ClearStale")

        async def run() -> pb.ClearStaleResponse:
            actions = await self._node.clear_stale(dry_run=request.dry_run)
            return pb.ClearStaleResponse(actions=actions, dry_run=request.dry_run)

        return await answer(context, run)

    async def ReportProgress(
        self, request: pb.ReportProgressRequest, context: Context
    ) -> pb.ReportProgressResponse:
        owner = self._identify(context).owner

        async def run() -> pb.ReportProgressResponse:
            lease_id = validate.identifier(request.lease_id, "lease_id")
            units = validate.units_done(request.units_done)
            done = await self._node.report_progress(lease_id, units, owner=owner)
            return pb.ReportProgressResponse(
                lease_id=done.lease_id,
                window_s=done.window_s,
                rate_per_s=done.rate_per_s,
                peers=done.peers,
                records=done.records,
            )

        return await answer(context, run)

    async def RetrainEstimator(
        self, request: pb.RetrainEstimatorRequest, context: Context
    ) -> pb.RetrainEstimatorResponse:
        await self._admin_only(context, "RetrainEstimator")

        async def run() -> pb.RetrainEstimatorResponse:
            done = await self._node.retrain_estimator()
            return pb.RetrainEstimatorResponse(
                swapped=done.swapped,
                reason=done.reason,
                figures=done.figures,
                node_records=done.node_records,
                model_dir=done.model_dir,
            )

        return await answer(context, run)

    async def AnswerClaim(
        self, request: pb.AnswerClaimRequest, context: Context
    ) -> pb.AnswerClaimResponse:
        """The binding answers of the claim's shares on this node: any authenticated
        caller (the binding controller's credentials on TCP) and the local socket."""
        caller = self._identify(context)

        async def run() -> pb.AnswerClaimResponse:
            claim = validate.claim_json(request.claim_json)
            meta = claim["metadata"]
            named = f"{escaped(meta['namespace'])}/{escaped(meta['name'])}"
            log.info(
                "AnswerClaim from %s: claim %s (uid %s)",
                escaped(caller.name),
                named,
                escaped(meta["uid"]),
            )
            answers = await self._claims.answer_claim(claim)
            return pb.AnswerClaimResponse(
                answers=[
                    pb.ShareAnswer(
                        device=a.device,
                        share_id=a.share_id,
                        admitted=a.admitted,
                        reason=a.reason,
                        message=a.message[:MAX_ANSWER_MESSAGE],
                    )
                    for a in answers
                ]
            )

        return await answer(context, run)
