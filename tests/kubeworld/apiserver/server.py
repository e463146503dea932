"""The stand-in API server: its HTTP app on loopback, the routes of each API group, and the
request path every request takes (token, holds, faults, ``Warning`` headers, errors as
``Status`` bodies)."""

from __future__ import annotations

import json
import logging
import ssl
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from tests.kubeworld.apiserver.apps import AppsV1
from tests.kubeworld.apiserver.coordination import CoordinationV1
from tests.kubeworld.apiserver.core import CoreV1
from tests.kubeworld.apiserver.discovery import DiscoveryV1
from tests.kubeworld.apiserver.errors import ApiError
from tests.kubeworld.apiserver.faults import Fault, Faults, Hold
from tests.kubeworld.apiserver.kinds import KINDS
from tests.kubeworld.apiserver.objects import Handler, Obj
from tests.kubeworld.apiserver.params import verb
from tests.kubeworld.apiserver.reads import ASKER, Asker, ClientCounting, ClientReads
from tests.kubeworld.apiserver.resource import CALL, FIELD_VALIDATIONS, Call, ResourceV1
from tests.kubeworld.apiserver.resource_schema import supported_version
from tests.kubeworld.apiserver.storage import Change, Storage, Store
from tests.kubeworld.apiserver.verbs import Verbs
from tests.kubeworld.apiserver.watch import Watcher, Watching

log = logging.getLogger(__name__)


class FakeApiServer(
    CoreV1,
    DiscoveryV1,
    CoordinationV1,
    AppsV1,
    ResourceV1,
    Verbs,
    Watching,
    Storage,
    ClientCounting,
    Faults,
):
    """The stand-in (see the module's text). ``async with`` starts it on 127.0.0.1."""

    def __init__(
        self,
        *,
        token: str = "",
        tokens: Mapping[str, str] | None = None,
        history: int = 1000,
        ssl_context: ssl.SSLContext | None = None,
        kube_version: str = "1.36",
        field_validation: str = "Strict",
    ) -> None:
        """``kube_version``: whose resource.k8s.io/v1 schemas validate writes (see
        :func:`kube_versions`). ``field_validation``: how a write of a resource.k8s.io object
        that names no ``fieldValidation`` is decoded (the real server's default is ``Warn``,
        kubectl sends ``Strict``). ``tokens``: bearer token -> client name (a node's name
        for a node's agent), each accepted beside ``token`` and its requests counted for
        that client (:meth:`client_token`, :meth:`claim_bytes_read`)."""
        if field_validation not in FIELD_VALIDATIONS:
            raise ValueError(f"field_validation: one of {FIELD_VALIDATIONS}")
        self.token = token
        self.tokens: dict[str, str] = dict(tokens or {})
        self.reads: dict[str, ClientReads] = {}  # client name -> what it was sent
        self._claim_nodes: dict[str, set[str]] = {}  # claim uid -> nodes it was allocated to
        self._claim_sizes: dict[str, tuple[str, int]] = {}  # uid -> (resourceVersion, bytes)
        self._unchecked = False  # put_objects(check_each=False) after its first object
        self.kube_version = supported_version(kube_version)
        self.field_validation = field_validation
        self.version = 0
        self.objects = Store({resource: {} for resource in KINDS})
        self.history: deque[Change] = deque(maxlen=history)
        self.floor = 0  # a watch from a version below this one has expired
        self.requests: Counter[str] = Counter()  # by Kubernetes verb: get, list, watch, ...
        # (method, path with query, content type) of every request, in order
        self.log: list[tuple[str, str, str]] = []
        # (path, DeleteOptions) of every DaemonSet DELETE, in order
        self.deletions: list[tuple[str, Obj]] = []
        self.faults: list[Fault] = []
        # asked about every request before the faults above: a fault to answer it with, or
        # None (a benchmark's random faults: bench/faults.py)
        self.chaos: Callable[[web.Request], Awaitable[Fault | None]] | None = None
        self.hanging = 0  # requests held by a hanging fault now
        self.holds: list[Hold] = []
        self.watchers: set[Watcher] = set()
        self._ssl = ssl_context
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.app = web.Application(middlewares=[self._middleware])
        self._routes()

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> FakeApiServer:
        self._runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"{'https' if self._ssl else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for watcher in list(self.watchers):
            watcher.queue.put_nowait(None)  # end every watch stream
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _routes(self) -> None:
        self._core_routes()
        self._discovery_routes()
        self._coordination_routes()
        self._apps_routes()
        self._dra_routes()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        content_type = request.content_type if request.can_read_body else ""
        self.log.append((request.method, request.path_qs, content_type))
        self.requests[verb(request)] += 1
        authorization = request.headers.get("Authorization", "")
        client = self.tokens.get(authorization.removeprefix("Bearer ")) if authorization else None
        if self.token and authorization != f"Bearer {self.token}" and client is None:
            return ApiError(401, "Unauthorized").response()
        if client is None:
            return await self._authorized(request, handler)
        self.client_reads(client).requests += 1
        asker = Asker(client)
        token = ASKER.set(asker)
        try:
            response = await self._authorized(request, handler)
        finally:
            ASKER.reset(token)
        if not asker.counted:
            self._count_answer(client, request, response)
        return response

    async def _authorized(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        for hold in list(self.holds):
            if hold.method == request.method and hold.path.search(request.path_qs):
                self.holds.remove(hold)
                hold.arrived.set()
                await hold.release.wait()
                break
        if self.chaos is not None and (drawn := await self.chaos(request)) is not None:
            return await self._faulted(drawn, request, handler)
        for fault in self.faults:
            if fault.method == request.method and fault.path.search(request.path_qs):
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
                return await self._faulted(fault, request, handler)
        return await self._serve(request, handler)

    async def _serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The handler's answer, with a ``Warning`` header for each warning it earned."""
        call = Call(request.query.get("fieldValidation") or self.field_validation)
        token = CALL.set(call)
        try:
            response = await self._answer(request, handler)
        finally:
            CALL.reset(token)
        if not response.prepared:
            for warning in call.warnings:
                response.headers.add("Warning", f"299 - {json.dumps(warning)}")
        return response

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except web.HTTPNotFound:
            return ApiError(404, "the server could not find the requested resource").response()
        except web.HTTPMethodNotAllowed:
            return ApiError(
                405, f"the server does not allow this method: {request.method}"
            ).response()
        except Exception as exc:  # a bug of the stand-in: say so in the server's format
            log.exception("stand-in API server failed on %s %s", request.method, request.path)
            return ApiError(500, f"stand-in failure: {exc!r}").response()
