"""How the agent talks to the Kubernetes API: ``kubernetes_asyncio``'s generated clients
over one ``ApiClient`` (its aiohttp session, its TLS and bearer-token handling, in-cluster
configuration with token rotation), each request's raw answer decoded here, and the API
server's statuses and the network's failures as the port's exceptions. What is said over
it is :mod:`agent.kubeapi.rest`'s.

Every call asks for the raw response (``_preload_content=False``) and decodes the JSON
itself: objects stay as the API server sent them (no model round trip, no renamed fields)
and the error statuses are read from the server's own ``Status`` body. Watches are read
line by line from the same list call with ``watch=true`` rather than through
``kubernetes_asyncio.watch.Watch``, which turns every event into a model object, opens a
second client with the default configuration, and retries a 410 by itself when no timeout
is set; here a 410 is the caller's to handle (list again).

Errors: 404 :class:`NotFound`, 409 :class:`Conflict`, 410 (and a watch ``ERROR`` event of
code 410) :class:`Gone`, any other status :class:`KubeError` with the server's reason;
no connection at all is ``KubeError(0, "Unreachable", ...)``: nothing was sent. A request
that timed out or whose connection broke once sent is :class:`Unanswered` (also status 0,
``Unreachable``): the server may have done what it asked."""

from __future__ import annotations

import json
import math
import os
import re
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, Self, cast

import aiohttp
from kubernetes_asyncio.client import (
    ApiClient,
    Configuration,
    CoordinationV1Api,
    CoreV1Api,
    DiscoveryV1Api,
    ResourceV1Api,
)
from kubernetes_asyncio.client.exceptions import ApiException, OpenApiException
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from agent.core.errors import ConfigError
from agent.kubeapi.port import (
    Conflict,
    Gone,
    KubeError,
    Listing,
    NotFound,
    Obj,
    PatchKind,
    Unanswered,
    WatchEvent,
    WatchKind,
)

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
PATCH_CONTENT_TYPES: Final[dict[PatchKind, str]] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
_BY_STATUS: Final[dict[int, type[KubeError]]] = {404: NotFound, 409: Conflict, 410: Gone}
_WATCH_KINDS: Final[frozenset[str]] = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})
_NETWORK_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
# raised before anything was sent: no connection could be made
_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


def proxy_from_env(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``, less
    hosts in ``NO_PROXY``), as client-go reads it; None for a direct connection."""
    proxies = urllib.request.getproxies_environment()
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0]
    proxy = proxies.get(scheme.lower())
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if not proxy or bypass(host, proxies):
        return None
    return proxy


def kube_error(status: int, reason: str, message: str) -> KubeError:
    """The port's exception for an HTTP status."""
    return _BY_STATUS.get(status, KubeError)(status, reason, message)


def error_from_status(status: Obj, *, http_status: int = 0, http_reason: str = "") -> KubeError:
    """A ``Status`` object (an error body or a watch ``ERROR`` event's object)."""
    code = status.get("code")
    return kube_error(
        int(code) if isinstance(code, int) else http_status,
        str(status.get("reason") or http_reason or "Unknown"),
        str(status.get("message") or ""),
    )


def error_from_body(http_status: int, http_reason: str, body: bytes) -> KubeError:
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        return error_from_status(decoded, http_status=http_status, http_reason=http_reason)
    text = body.decode("utf-8", "replace").strip()[:500]
    return kube_error(http_status, http_reason or "Unknown", text)


def unreachable(exc: BaseException) -> KubeError:
    """A network failure: :class:`Unanswered` unless the request was never sent."""
    error = KubeError if isinstance(exc, _NOT_SENT) else Unanswered
    return error(0, "Unreachable", str(exc) or type(exc).__name__)


_VERSION = re.compile(rb'"resourceVersion"\s*:\s*"([^"]*)"')


def skipped(line: bytes) -> WatchEvent:
    """A watch line left undecoded, as a BOOKMARK carrying its object's resourceVersion
    (the first in the line: the object's metadata comes before its spec and status)."""
    found = _VERSION.search(line)
    version = found.group(1).decode() if found else ""
    return WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": version}})


def selectors(field_selector: str, label_selector: str) -> dict[str, str]:
    selectors = {"field_selector": field_selector, "label_selector": label_selector}
    return {key: value for key, value in selectors.items() if value}


def listing_of(listed: Obj) -> Listing:
    version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
    return Listing(items=list(listed.get("items") or []), resource_version=version)


class ApiConnection:
    """The Kubernetes API over HTTPS. Build it with :meth:`in_cluster` or :meth:`from_url`
    (no I/O: the client and its connections are made on the first call, in the loop that
    makes it), close it with :meth:`aclose`."""

    def __init__(self, configuration: Configuration, *, timeout_s: float = 30.0) -> None:
        self._configuration = configuration
        self._timeout_s = timeout_s
        self._apis: (
            tuple[ApiClient, CoreV1Api, DiscoveryV1Api, CoordinationV1Api, ResourceV1Api] | None
        ) = None

    @classmethod
    def in_cluster(
        cls,
        *,
        token_file: str = f"{SERVICE_ACCOUNT}/token",
        ca_file: str = f"{SERVICE_ACCOUNT}/ca.crt",
        environ: dict[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> Self:
        """The pod's service account: ``KUBERNETES_SERVICE_HOST``/``_PORT``, its token
        (read again every minute: bound tokens rotate) and the cluster's CA."""
        configuration = Configuration()
        loader = InClusterConfigLoader(
            token_file, ca_file, environ=os.environ if environ is None else environ
        )
        try:
            loader.load_and_set(configuration)
        except ConfigException as exc:
            raise ConfigError("kubernetes", f"not in a cluster: {exc}") from exc
        reread = configuration.refresh_api_key_hook

        def refresh(conf: Configuration) -> None:
            """The loader's own (the file again when due), less a trailing newline."""
            if callable(reread):
                reread(conf)
            conf.api_key["BearerToken"] = str(conf.api_key["BearerToken"]).strip()

        configuration.refresh_api_key_hook = refresh
        refresh(configuration)
        return cls(configuration, timeout_s=timeout_s)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        token: str = "",
        ca_file: str = "",
        verify: bool = True,
        timeout_s: float = 30.0,
    ) -> Self:
        """An API server at ``url`` (``https://host:6443``), with a bearer token."""
        configuration = Configuration(host=url.rstrip("/"))
        if token:
            configuration.api_key["BearerToken"] = f"Bearer {token.strip()}"
        if ca_file:
            configuration.ssl_ca_cert = ca_file
        configuration.verify_ssl = verify
        return cls(configuration, timeout_s=timeout_s)

    @property
    def host(self) -> str:
        return str(self._configuration.host)

    # -- plumbing --------------------------------------------------------------------------

    def _core(self) -> CoreV1Api:
        return self._clients()[1]

    def _discovery(self) -> DiscoveryV1Api:
        return self._clients()[2]

    def _coordination(self) -> CoordinationV1Api:
        return self._clients()[3]

    def _resource(self) -> ResourceV1Api:
        return self._clients()[4]

    def _clients(
        self,
    ) -> tuple[ApiClient, CoreV1Api, DiscoveryV1Api, CoordinationV1Api, ResourceV1Api]:
        if self._apis is None:  # its aiohttp session belongs to the running loop
            if self._configuration.proxy is None:
                self._configuration.proxy = proxy_from_env(str(self._configuration.host))
            client = ApiClient(self._configuration)
            # trust_env makes aiohttp look up ~/.netrc and the proxy variables again on
            # every request, each in a worker thread (a sixth of a busy extender's CPU);
            # the proxy is looked up once above, and netrc has no say on a token API
            client.rest_client.pool_manager._trust_env = False
            self._apis = (
                client,
                CoreV1Api(client),
                DiscoveryV1Api(client),
                CoordinationV1Api(client),
                ResourceV1Api(client),
            )
        return self._apis

    async def _open(
        self,
        call: Callable[..., Awaitable[Any]],
        *args: Any,
        request_timeout: aiohttp.ClientTimeout | None = None,
        **kwargs: Any,
    ) -> aiohttp.ClientResponse:
        """Send one request; the response once its status is a success (its body unread)."""
        try:
            response = cast(
                aiohttp.ClientResponse,
                await call(
                    *args,
                    _preload_content=False,
                    _request_timeout=request_timeout or self._timeout_s,
                    **kwargs,
                ),
            )
        except ApiException as exc:
            raise kube_error(exc.status or 0, str(exc.reason), str(exc.body or "")) from exc
        except OpenApiException as exc:  # the client refused the arguments before sending
            raise KubeError(0, "BadRequest", str(exc)) from exc
        except _NETWORK_ERRORS as exc:
            raise unreachable(exc) from exc
        if response.status >= 400:
            try:
                body = await response.read()
            except _NETWORK_ERRORS:
                body = b""
            finally:
                response.release()
            raise error_from_body(response.status, response.reason or "", body)
        return response

    async def _call(self, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Obj:
        response = await self._open(call, *args, **kwargs)
        try:
            body = await response.read()
        except _NETWORK_ERRORS as exc:
            raise unreachable(exc) from exc
        finally:
            response.release()
        try:
            return cast(Obj, json.loads(body)) if body else {}
        except ValueError as exc:
            raise KubeError(response.status, "BadResponse", f"not JSON: {body[:200]!r}") from exc

    async def _watch(
        self,
        call: Callable[..., Awaitable[Any]],
        resource_version: str,
        timeout_s: float,
        mentioning: bytes = b"",
        **kwargs: Any,
    ) -> AsyncIterator[WatchEvent]:
        """The watch's events. With ``mentioning``, an event whose line does not contain
        it is not decoded: it comes as a BOOKMARK with its resourceVersion alone (read
        from the line), so the caller resumes past it without paying for its object."""
        # The server closes the stream after timeoutSeconds; a read that stays silent well
        # past that is a connection that died without saying so.
        read_timeout = aiohttp.ClientTimeout(
            sock_connect=self._timeout_s, sock_read=timeout_s + self._timeout_s
        )
        response = await self._open(
            call,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=max(1, math.ceil(timeout_s)),
            request_timeout=read_timeout,
            **kwargs,
        )
        try:
            while True:
                try:
                    line = await response.content.readline()
                except _NETWORK_ERRORS as exc:
                    raise unreachable(exc) from exc
                if not line:
                    return
                if not line.strip():
                    continue
                if mentioning and mentioning not in line and b'"ERROR"' not in line:
                    yield skipped(line)
                    continue
                try:
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise KubeError(0, "BadResponse", f"not a watch event: {line[:200]!r}") from exc
                if kind == "ERROR":
                    raise error_from_status(obj if isinstance(obj, dict) else {}, http_status=500)
                if kind in _WATCH_KINDS:
                    yield WatchEvent(cast(WatchKind, kind), obj)
        finally:
            response.release()

    async def aclose(self) -> None:
        apis, self._apis = self._apis, None
        if apis is not None:
            await apis[0].close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()
