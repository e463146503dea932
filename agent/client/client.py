"""The client behind :mod:`agent.client`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.config.filewatch import Stamp, stamp_of

log = logging.getLogger(__name__)
T = TypeVar("T")
Priority = pb.Priority
RETRIED = (grpc.StatusCode.UNAVAILABLE,)
RETRAIN_TIMEOUT_S = 600.0  # a retrain trains a forest: minutes on a small node


def tls_credentials(
    ca_file: str, *, cert_file: str = "", key_file: str = ""
) -> grpc.ChannelCredentials:
    """Channel credentials that trust the agent's CA (``ca_file``) and, for mutual TLS,
    present the client certificate ``cert_file`` with its key ``key_file``."""
    if bool(cert_file) != bool(key_file):
        raise ValueError("a client certificate needs both cert_file and key_file")
    ca = Path(ca_file).read_bytes()
    cert = Path(cert_file).read_bytes() if cert_file else None
    key = Path(key_file).read_bytes() if key_file else None
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def read_token_file(path: str) -> str:
    """The bearer token in ``path``, surrounding whitespace stripped."""
    return Path(path).read_text().strip()


class TokenFile:
    """A bearer token file read again whenever it changes (a stat per call: a mounted
    Secret is swapped by a new link, a file by ``mv``), for a long-lived client that must
    follow a rotation at its next call. A file that cannot be read, or reads empty (caught
    half written), keeps the last token read; the first read must succeed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: Stamp | None = None
        self._token = ""
        try:
            self._read_if_changed()
        except ValueError as exc:
            raise ValueError(f"token file {path}: {exc}") from exc

    def _read_if_changed(self) -> None:
        """A stat per call; on a change, the file read and its stamp taken from the same
        open file, so the token and its stamp agree. A bad read is not tried again until
        the file changes once more."""
        if stamp_of(os.stat(self.path)) == self._stamp:
            return
        with open(self.path, "rb") as file:
            stamp = stamp_of(os.fstat(file.fileno()))
            raw = file.read()
        self._stamp = stamp
        token = raw.decode().strip()  # ValueError: not UTF-8
        if not token:
            raise ValueError("it is empty")
        self._token = token

    def __call__(self) -> str:
        try:
            self._read_if_changed()
        except (OSError, ValueError) as exc:
            log.warning("token file %s not read again (the last token kept): %s", self.path, exc)
        return self._token


TokenSource = Callable[[], str | None]  # asked at each call


class AgentClient:
    def __init__(
        self,
        target: str,
        *,
        token: str | TokenSource | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str = "",
        timeout_s: float = 10.0,
        attempts: int = 5,
        backoff_s: float = 0.1,
    ) -> None:
        self.target = target
        self._token = token
        self._credentials = credentials
        self._options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.AgentStub | None = None

    async def __aenter__(self) -> AgentClient:
        if self._credentials is not None:
            self._channel = grpc.aio.secure_channel(
                self.target, self._credentials, options=self._options
            )
        else:
            self._channel = grpc.aio.insecure_channel(self.target)
        self._stub = pb_grpc.AgentStub(self._channel)
        return self

    async def __aexit__(
        self, *_exc: type[BaseException] | BaseException | TracebackType | None
    ) -> None:
        if self._channel is not None:
            await self._channel.close(None)

    @property
    def stub(self) -> pb_grpc.AgentStub:
        if self._stub is None:
            raise RuntimeError("use the client in 'async with'")
        return self._stub

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The call's ``authorization``: a token source is asked each time (a rotation
        takes effect at the next call, on the connection already open)."""
        token = self._token() if callable(self._token) else self._token
        return (("authorization", f"Bearer {token}"),) if token else ()

    async def _call(
        self, method: Callable[..., Awaitable[T]], request: Any, *, timeout_s: float | None = None
    ) -> T:
        delay = self._backoff_s
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        for attempt in range(1, self._attempts + 1):
            try:
                return await method(request, timeout=timeout_s, metadata=self._metadata())
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRIED or attempt == self._attempts:
                    raise
                log.info(
                    "agent %s unavailable (%s); retry %d in %.2f s",
                    self.target,
                    exc.details(),
                    attempt,
                    delay,
                )
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    @staticmethod
    def request(
        *, request_id: str | None = None, run_as_uid: int | None = None, **fields: Any
    ) -> pb.Request:
        """A Request with a fresh request id unless one is given (keep it to retry).
        ``run_as_uid``: the UID the share's processes run as (the container's runAsUser);
        None leaves it unset, and the agent's one-user-per-MPS-server rule cannot apply."""
        request = pb.Request(request_id=request_id or f"r-{uuid.uuid4().hex}", **fields)
        if run_as_uid is not None:
            request.run_as_uid = run_as_uid
        return request

    async def admit(self, *, run_as_uid: int | None = None, **fields: Any) -> pb.AdmitResponse:
        """Admit one request (fields of ``Request``); see :meth:`request` for ``run_as_uid``."""
        request = pb.AdmitRequest(request=self.request(run_as_uid=run_as_uid, **fields))
        return await self._call(self.stub.Admit, request)

    async def explain(self, *, run_as_uid: int | None = None, **fields: Any) -> pb.AdmitResponse:
        """What Admit would answer, admitting nothing; ``run_as_uid`` as for :meth:`admit`."""
        request = pb.AdmitRequest(request=self.request(run_as_uid=run_as_uid, **fields))
        return await self._call(self.stub.Explain, request)

    async def admit_batch(self, requests: list[pb.Request]) -> pb.AdmitBatchResponse:
        return await self._call(self.stub.AdmitBatch, pb.AdmitBatchRequest(requests=requests))

    async def reserve(self, gang_id: str, *, ttl_s: float = 0.0, **fields: Any) -> pb.AdmitResponse:
        request = pb.ReserveRequest(request=self.request(**fields), gang_id=gang_id, ttl_s=ttl_s)
        return await self._call(self.stub.Reserve, request)

    async def commit(self, gang_id: str) -> pb.GangResponse:
        return await self._call(self.stub.Commit, pb.GangRequest(gang_id=gang_id))

    async def abort(self, gang_id: str) -> pb.GangResponse:
        return await self._call(self.stub.Abort, pb.GangRequest(gang_id=gang_id))

    async def release(self, lease_id: str) -> pb.ReleaseResponse:
        return await self._call(self.stub.Release, pb.ReleaseRequest(lease_id=lease_id))

    async def report_progress(self, lease_id: str, units_done: float) -> pb.ReportProgressResponse:
        """The work units ``lease_id``'s workload has done since it started (cumulative,
        never going down); the agent times the report itself."""
        request = pb.ReportProgressRequest(lease_id=lease_id, units_done=units_done)
        return await self._call(self.stub.ReportProgress, request)

    async def retrain_estimator(
        self, *, timeout_s: float = RETRAIN_TIMEOUT_S
    ) -> pb.RetrainEstimatorResponse:
        """Retrain the retention model on the node's run records now (admin: the agent's
        Unix socket). Training takes a while: the call waits up to ``timeout_s``."""
        request = pb.RetrainEstimatorRequest()
        return await self._call(self.stub.RetrainEstimator, request, timeout_s=timeout_s)

    async def answer_claim(self, claim: Mapping[str, Any]) -> pb.AnswerClaimResponse:
        """The agent's binding answers on ``claim`` (a ResourceClaim as the API server has
        it, sent as JSON): one per share of it on the agent's node that waits for its
        binding condition. Safe to repeat (the same claim gets the same answer and the
        same leases), so it is retried on UNAVAILABLE like every call here."""
        request = pb.AnswerClaimRequest(claim_json=json.dumps(claim).encode())
        return await self._call(self.stub.AnswerClaim, request)

    async def get_node(self, *, ledger_only: bool = False) -> pb.GetNodeResponse:
        """The node (``ledger_only``: only devices, leases and ledger; cheaper)."""
        return await self._call(self.stub.GetNode, pb.GetNodeRequest(ledger_only=ledger_only))

    async def ping(self) -> pb.PingResponse:
        return await self._call(self.stub.Ping, pb.PingRequest())

    async def watch_events(self, *, since_seq: int = 0) -> AsyncIterator[pb.Event]:
        """Events after ``since_seq``, for ever; reconnects and resumes where it was."""
        last = since_seq
        delay = self._backoff_s
        while True:
            try:
                stream = self.stub.WatchEvents(
                    pb.WatchEventsRequest(since_seq=last), metadata=self._metadata()
                )
                async for event in stream:
                    last = event.seq
                    delay = self._backoff_s
                    yield event
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRIED:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
