"""A test kubelet for DRA drivers: what the kubelet does with a DRA kubelet plugin, over the
real gRPC APIs (the kubelet's own protos, generated in ``agent.dra.proto``) on Unix sockets.

* Plugin watcher: ``registry_dir`` is polled for ``*-reg.sock`` sockets. For a new one it
  dials (10 s), calls ``GetInfo`` (1 s), validates (type ``DRAPlugin``, a driver name, the
  first listed service it knows among ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin``, no
  endpoint registered twice for a driver) and answers ``NotifyRegistrationStatus`` (5 s),
  ``false`` with the kubelet's error sentence when it refuses. A failed registration is
  tried again with the kubelet's backoff (0.5 s, doubling, at most 2 min 2 s). A deleted
  socket deregisters its plugin (its channel and health stream are closed); a re-created
  one (another inode or modification time) is registered again.
* Health: once registered, ``NodeWatchResources`` on the plugin's endpoint (``v1``, or
  ``v1alpha1`` when ``v1`` is UNIMPLEMENTED), opened again every 5 s after it ends. Each
  message is the full list: a device left out becomes Unknown, and so does one whose last
  report is older than its ``health_check_timeout_seconds`` (30 s when not above 0).
* :meth:`DraKubelet.prepare` / :meth:`DraKubelet.unprepare`: NodePrepareResources /
  NodeUnprepareResources with ``{namespace, uid, name}`` per claim, sent to every driver
  named in the claim's allocation results, through the newest endpoint registered for it,
  on the service chosen at registration, with a 45 s timeout; a call under way when its
  plugin is deregistered fails (CANCELLED: the connection is closed under it). Each call
  (or attempt where the driver is not registered) is kept in ``calls``.
* Retries (``retry``, off unless given): a claim whose Prepare or Unprepare failed, for
  whatever reason (the driver's error, UNAVAILABLE, a deadline, a driver not registered),
  is sent again after a back-off, doubling up to a ceiling, until it succeeds or the
  deadline has passed. This is the kubelet's pod worker: a failed Prepare fails the pod's
  sync and a failed Unprepare keeps the terminated pod's cleanup pending, and the worker
  syncs the pod again after a back-off (10 s, jittered, in the kubelet) with the claims
  not yet done; claims done in the same call are not sent again.
* :meth:`DraKubelet.run_pod` / :meth:`DraKubelet.stop_pod`: the pod's claims (given, or read
  from the API server) are checked as the kubelet checks them (reserved for the pod),
  prepared once per node however many pods use them, and each container is created as a
  CDI-aware runtime creates it: the CDI ids of the claims (requests) it references are
  resolved against the spec files in ``cdi_dirs`` and their ``containerEdits`` applied. A
  claim is unprepared when the last pod of this kubelet using it stops.

Where it is simpler than the kubelet: sockets are polled, not watched with inotify, and
only ``*-reg.sock`` names are looked at; the newest endpoint of a driver is called whether
or not its connection is up; the health stream is opened as by a kubelet with the
ResourceHealthStatus gate on, and the devices of a deregistered plugin keep their health
until it times out; ResourceSlices are never wiped; the claims prepared are kept in memory
only (a :meth:`DraKubelet.stop` and :meth:`DraKubelet.start` keep them, as a kubelet's
restart keeps its checkpoint), a claim made from a template is not checked to be owned by
the pod, and without ``retry`` nothing is retried (a test calls ``run_pod`` again) and a
failed unprepare is not retried. The runtime applies env, mounts and device nodes only
(hooks and the rest are ignored, host device nodes are not looked at, mounts are not
sorted by depth).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import stat
import string
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import grpc
import grpc.aio
import yaml

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
from agent.dra.proto import registration_pb2 as reg
from agent.dra.proto import registration_pb2_grpc as reg_grpc

Obj = dict[str, Any]

PLUGIN_TYPE = "DRAPlugin"
# the DRAPlugin services this kubelet speaks, as GetInfo's supported_versions names them
SERVICES: dict[str, tuple[ModuleType, Any]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub),
}
HEALTH_SERVICES: dict[str, tuple[ModuleType, Any]] = {  # tried in this order
    "v1.DRAResourceHealth": (health_v1_pb2, health_v1_pb2_grpc.DRAResourceHealthStub),
    "v1alpha1.DRAResourceHealth": (
        health_v1alpha1_pb2,
        health_v1alpha1_pb2_grpc.DRAResourceHealthStub,
    ),
}
DIAL_TIMEOUT_S = 10.0
GET_INFO_TIMEOUT_S = 1.0
NOTIFY_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 45.0
HEALTH_TIMEOUT_S = 30.0
HEALTH_RETRY_S = 5.0
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 122.0  # the kubelet's operation backoff
DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
UNKNOWN, HEALTHY, UNHEALTHY = "Unknown", "Healthy", "Unhealthy"
HEALTH_NAMES = {0: UNKNOWN, 1: HEALTHY, 2: UNHEALTHY}


class DraKubeletError(Exception):
    """The kubelet stand-in cannot do what was asked."""


class PodStartError(DraKubeletError):
    """The pod's claims could not be prepared (the kubelet's FailedPrepareDynamicResources):
    none of its containers starts."""


class CdiError(DraKubeletError):
    """The runtime could not inject a container's CDI devices."""


class _Refused(DraKubeletError):
    """A registration refused: the text sent in NotifyRegistrationStatus(false)."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a NodePrepareResources answer."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    driver: str = ""

    def serves(self, request: str | None) -> bool:
        """Whether a container that references ``request`` (None: the whole claim) gets it;
        a device with no request names serves every request."""
        return request is None or not self.request_names or request in self.request_names


ClaimResult = list[PreparedDevice] | str  # the devices, or the claim's error


@dataclass(frozen=True)
class Retry:
    """How the kubelet tries a failed Prepare or Unprepare again: after ``first_s``,
    doubling up to ``max_s``, until ``deadline_s`` after the first try."""

    first_s: float = 0.1
    max_s: float = 1.0
    deadline_s: float = 60.0


@dataclass(frozen=True)
class Call:
    """One NodePrepareResources or NodeUnprepareResources sent to a driver (or not sent:
    the driver is not registered, the error says so)."""

    method: str
    driver: str
    errors: dict[str, str]  # claim uid -> its error, "" = done

    @property
    def failed(self) -> dict[str, str]:
        return {uid: error for uid, error in self.errors.items() if error}


@dataclass
class FakeContainer:
    """A container as the runtime created it; ``error`` is its CreateContainerError ("" when
    it started)."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Obj] = field(default_factory=list)
    device_nodes: list[Obj] = field(default_factory=list)
    cdi_ids: list[str] = field(default_factory=list)
    error: str = ""


@dataclass(eq=False)
class _Plugin:
    socket: Path
    identity: tuple[int, int]
    info: reg.PluginInfo
    service: str
    channel: grpc.aio.Channel
    health_service: str = ""
    health_task: asyncio.Task[None] | None = None

    @property
    def driver(self) -> str:
        return str(self.info.name)


@dataclass
class _Retry:
    identity: tuple[int, int]
    at: float
    backoff_s: float


@dataclass
class _DeviceHealth:
    status: str
    message: str
    received_at: float
    timeout_s: float


@dataclass
class _ClaimRecord:
    claim: Obj
    pods: set[str] = field(default_factory=set)
    devices: list[PreparedDevice] | None = None  # set once prepared


def claim_key(claim: Obj) -> tuple[str, str, str]:
    """``(namespace, uid, name)`` of a ResourceClaim object."""
    meta = claim["metadata"]
    return meta.get("namespace", "default"), meta["uid"], meta["name"]


def claim_drivers(claim: Obj) -> list[str]:
    """The drivers named in the claim's allocation results, in order."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return list(dict.fromkeys(r["driver"] for r in results))


def choose_service(versions: Sequence[str]) -> str:
    """The first listed service the kubelet speaks, or ValueError with the kubelet's words."""
    if not versions:
        raise ValueError("empty list of supported gRPC services (aka supported versions)")
    for version in versions:
        if version in SERVICES:
            return version
    raise ValueError(
        f"none of services supported by the plugin ({_go_quote(versions)}) "
        f"are supported by the kubelet ({_go_quote(SERVICES)})"
    )


def _go_quote(items: Iterable[str]) -> str:
    return "[" + " ".join(json.dumps(item) for item in items) + "]"


class DraKubelet:
    """The kubelet's DRA side for one node. Use as ``async with DraKubelet(...) as kubelet``
    (or :meth:`start` / :meth:`stop`)."""

    def __init__(
        self,
        registry_dir: Path | str,
        *,
        node_name: str,
        api_url: str | None = None,
        token: str = "",
        api_ssl: Any = None,
        cdi_dirs: Sequence[Path | str] = DEFAULT_CDI_DIRS,
        check_reserved_for: bool = True,
        poll_s: float = 0.05,
        call_timeout_s: float = CALL_TIMEOUT_S,
        health_retry_s: float = HEALTH_RETRY_S,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        retry: Retry | None = None,
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.node_name = node_name
        self.api_url = api_url.rstrip("/") if api_url else None
        self.token = token
        self.api_ssl = api_ssl
        self.cdi_dirs = [Path(d) for d in cdi_dirs]
        self.check_reserved_for = check_reserved_for
        self.poll_s = poll_s
        self.call_timeout_s = call_timeout_s
        self.health_retry_s = health_retry_s
        self.health_timeout_s = health_timeout_s
        self.clock = clock  # for health timeouts
        self.retry = retry  # None: a failed Prepare or Unprepare is not sent again
        self.calls: list[Call] = []  # every Prepare and Unprepare, in order
        self.registrations = 0  # successful registrations, re-registrations included
        self.registration_errors: list[str] = []  # every NotifyRegistrationStatus(false) text
        self.cdi_errors: dict[str, str] = {}  # spec file -> why it was ignored (last creation)
        self._sockets: dict[Path, _Plugin] = {}
        self._drivers: dict[str, list[_Plugin]] = {}  # in registration order
        self._retries: dict[Path, _Retry] = {}
        self._attempts: dict[Path, asyncio.Task[None]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._health: dict[str, dict[tuple[str, str], _DeviceHealth]] = {}
        self._claims: dict[str, _ClaimRecord] = {}  # claim uid -> record
        self._watcher: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._watcher = asyncio.create_task(
            self._watch(), name=f"dra-kubelet-watch-{self.node_name}"
        )

    async def stop(self) -> None:
        tasks = [t for t in (self._watcher, *self._attempts.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watcher = None
        for socket in list(self._sockets):
            await self._deregister(socket)
        if self._closing:
            await asyncio.wait(list(self._closing))
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> DraKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- plugin watcher ----------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await self._scan()
            await asyncio.sleep(self.poll_s)

    async def _scan(self) -> None:
        present = self._registration_sockets()
        for socket, plugin in list(self._sockets.items()):
            if present.get(socket) != plugin.identity:  # deleted, or re-created
                await self._deregister(socket)
        for socket, identity in present.items():
            if socket in self._sockets or socket in self._attempts:
                continue
            if not self._due(socket, identity):
                continue
            task = asyncio.create_task(
                self._try_register(socket, identity), name=f"dra-kubelet-register-{socket.name}"
            )
            self._attempts[socket] = task

    def _registration_sockets(self) -> dict[Path, tuple[int, int]]:
        found = {}
        for path in self.registry_dir.glob("*-reg.sock"):
            with contextlib.suppress(FileNotFoundError):
                info = path.stat()
                if stat.S_ISSOCK(info.st_mode):  # bind() sets the time; a chmod does not
                    found[path] = (info.st_ino, info.st_mtime_ns)
        return found

    def _due(self, socket: Path, identity: tuple[int, int]) -> bool:
        retry = self._retries.get(socket)
        return retry is None or retry.identity != identity or time.monotonic() >= retry.at

    async def _try_register(self, socket: Path, identity: tuple[int, int]) -> None:
        try:
            await self._register(socket, identity)
        except (grpc.aio.AioRpcError, TimeoutError, _Refused):
            old = self._retries.get(socket)
            backoff_s = RETRY_FIRST_S
            if old is not None and old.identity == identity:
                backoff_s = min(old.backoff_s * 2, RETRY_MAX_S)
            self._retries[socket] = _Retry(identity, time.monotonic() + backoff_s, backoff_s)
        else:
            self._retries.pop(socket, None)
        finally:
            self._attempts.pop(socket, None)

    async def _register(self, socket: Path, identity: tuple[int, int]) -> None:
        """Dial, GetInfo, validate and add, then NotifyRegistrationStatus; the registration
        channel is closed afterwards, as the kubelet closes it."""
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            await asyncio.wait_for(channel.channel_ready(), DIAL_TIMEOUT_S)
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg.InfoRequest(), timeout=GET_INFO_TIMEOUT_S)
            if not info.endpoint:
                info.endpoint = str(socket)
            try:
                self._add(socket, identity, info, self._validate(socket, info))
            except _Refused as refused:
                self.registration_errors.append(str(refused))
                await _notify(stub, False, str(refused))
                raise
            # a failed notification leaves the plugin registered, as in the kubelet
            with contextlib.suppress(grpc.aio.AioRpcError):
                await _notify(stub, True, "")

    def _validate(self, socket: Path, info: reg.PluginInfo) -> str:
        """The service to call the plugin on, or the kubelet's refusal."""
        if info.type != PLUGIN_TYPE:
            raise _Refused(
                "RegisterPlugin error -- no handler registered for plugin type: "
                f"{info.type} at socket {socket}"
            )
        failed = "RegisterPlugin error -- plugin validation failed with err:"
        if not info.name:
            raise _Refused(f"{failed} DRA driver name is empty")
        try:
            return choose_service(list(info.supported_versions))
        except ValueError as exc:
            raise _Refused(
                f"{failed} invalid supported gRPC versions of DRA driver plugin {info.name} "
                f"at endpoint {info.endpoint}: {exc}"
            ) from None

    def _add(
        self, socket: Path, identity: tuple[int, int], info: reg.PluginInfo, service: str
    ) -> None:
        plugins = self._drivers.get(info.name, [])
        if any(p.info.endpoint == info.endpoint for p in plugins):
            raise _Refused(
                "RegisterPlugin error -- plugin registration failed with err: endpoint "
                f"{info.endpoint} already registered for DRA driver plugin {info.name}"
            )
        channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        plugin = _Plugin(socket, identity, info, service, channel)
        plugin.health_task = asyncio.create_task(
            self._watch_health(plugin), name=f"dra-kubelet-health-{info.name}"
        )
        self._drivers[info.name] = [*plugins, plugin]
        self._sockets[socket] = plugin
        self.registrations += 1

    async def _deregister(self, socket: Path) -> None:
        plugin = self._sockets.pop(socket, None)
        if plugin is None:
            return
        remaining = [p for p in self._drivers.get(plugin.driver, []) if p is not plugin]
        if remaining:
            self._drivers[plugin.driver] = remaining
        else:
            self._drivers.pop(plugin.driver, None)
        # closed in a task of its own, which a stop that cancels the watcher meanwhile
        # neither interrupts nor is swallowed by
        closing = asyncio.create_task(_close(plugin), name=f"dra-kubelet-close-{socket.name}")
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        await asyncio.wait([closing])

    # -- what tests look at --------------------------------------------------------------

    @property
    def registered(self) -> dict[str, reg.PluginInfo]:
        """Driver -> the GetInfo answer of its newest registered plugin (endpoint filled in)."""
        return {driver: plugins[-1].info for driver, plugins in self._drivers.items()}

    def service(self, driver: str) -> str:
        """The DRAPlugin service chosen at registration (``v1.DRAPlugin`` ...)."""
        return self._plugin(driver).service

    def health_service(self, driver: str) -> str:
        """The health service the open stream uses ("" before one answered)."""
        return self._plugin(driver).health_service

    @property
    def claim_pods(self) -> dict[str, set[str]]:
        """Claim uid -> uids of the pods of this kubelet that use it."""
        return {uid: set(record.pods) for uid, record in self._claims.items()}

    async def wait_for(self, predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await asyncio.sleep(0.01)

    async def wait_registered(self, driver: str, timeout_s: float = 10.0) -> reg.PluginInfo:
        await self.wait_for(lambda: driver in self._drivers, timeout_s)
        return self.registered[driver]

    def _plugin(self, driver: str) -> _Plugin:
        plugins = self._drivers.get(driver)
        if not plugins:
            raise DraKubeletError(f"DRA driver {driver} is not registered")
        return plugins[-1]

    # -- health --------------------------------------------------------------------------

    def health(self, driver: str) -> dict[tuple[str, str], tuple[str, str]]:
        """(pool, device) -> (Healthy | Unhealthy | Unknown, message), as of now."""
        now = self.clock()
        return {
            key: (UNKNOWN if now - h.received_at > h.timeout_s else h.status, h.message)
            for key, h in self._health.get(driver, {}).items()
        }

    async def _watch_health(self, plugin: _Plugin) -> None:
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._stream_health(plugin)
            await asyncio.sleep(self.health_retry_s)

    async def _stream_health(self, plugin: _Plugin) -> None:
        for name, (pb, stub_class) in HEALTH_SERVICES.items():
            stream = stub_class(plugin.channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
            try:
                async for answer in stream:
                    plugin.health_service = name
                    self._record_health(plugin.driver, answer)
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise

    def _record_health(self, driver: str, answer: Any) -> None:
        """One full list: its devices as reported, stamped now; the others Unknown."""
        now = self.clock()
        devices = self._health.setdefault(driver, {})
        reported = set()
        for entry in answer.devices:
            key = (entry.device.pool_name, entry.device.device_name)
            timeout_s = entry.health_check_timeout_seconds
            devices[key] = _DeviceHealth(
                HEALTH_NAMES.get(entry.health, UNKNOWN),
                entry.message,
                now,
                float(timeout_s) if timeout_s > 0 else self.health_timeout_s,
            )
            reported.add(key)
        for key, known in devices.items():
            if key not in reported:
                known.status = UNKNOWN

    # -- NodePrepareResources / NodeUnprepareResources ---------------------------------------

    async def prepare(self, claims: Sequence[Obj]) -> dict[str, ClaimResult]:
        """NodePrepareResources for these ResourceClaim objects, per driver of their
        allocation: claim uid -> the devices of all its drivers, or an error (the driver's
        own text, or why it could not be asked; the last one, with ``retry``)."""
        results = await self._prepare_once(claims)
        await self._retry(claims, results, lambda r: isinstance(r, str), self._prepare_once)
        return results

    async def unprepare(self, claims: Sequence[Obj]) -> dict[str, str]:
        """NodeUnprepareResources for these claims, per driver: uid -> error ("" = done)."""
        results = await self._unprepare_once(claims)
        await self._retry(claims, results, bool, self._unprepare_once)
        return results

    async def _retry(
        self,
        claims: Sequence[Obj],
        results: dict[str, Any],
        failed: Callable[[Any], bool],
        once: Callable[[Sequence[Obj]], Any],
    ) -> None:
        """With ``retry``: the failed claims sent again, ``results`` updated, until none
        fails or the next try would come after the deadline."""
        if self.retry is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry.deadline_s
        backoff_s = self.retry.first_s
        while True:
            again = [c for c in claims if failed(results[claim_key(c)[1]])]
            if not again or loop.time() + backoff_s > deadline:
                return
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, self.retry.max_s)
            results.update(await once(again))

    async def _prepare_once(self, claims: Sequence[Obj]) -> dict[str, ClaimResult]:
        results: dict[str, ClaimResult] = {}
        groups: dict[str, list[Obj]] = {}
        for claim in claims:
            namespace, uid, name = claim_key(claim)
            if not (claim.get("status") or {}).get("allocation"):
                results[uid] = f"ResourceClaim {namespace}/{name} is not allocated"
                continue
            results[uid] = []
            for driver in claim_drivers(claim):
                groups.setdefault(driver, []).append(claim)
        for driver, group in groups.items():
            for uid, result in (await self._prepare_on(driver, group)).items():
                done = results[uid]
                if isinstance(done, list):
                    results[uid] = result if isinstance(result, str) else done + result
        return results

    async def _unprepare_once(self, claims: Sequence[Obj]) -> dict[str, str]:
        results = {claim_key(claim)[1]: "" for claim in claims}
        groups: dict[str, list[Obj]] = {}
        for claim in claims:
            for driver in claim_drivers(claim):
                groups.setdefault(driver, []).append(claim)
        for driver, group in groups.items():
            for uid, error in (await self._unprepare_on(driver, group)).items():
                results[uid] = results[uid] or error
        return results

    async def _prepare_on(self, driver: str, claims: list[Obj]) -> dict[str, ClaimResult]:
        method = "NodePrepareResources"
        results = await self._prepare_answers(driver, claims)
        errors = {uid: r if isinstance(r, str) else "" for uid, r in results.items()}
        self.calls.append(Call(method, driver, errors))
        return results

    async def _prepare_answers(self, driver: str, claims: list[Obj]) -> dict[str, ClaimResult]:
        uids = [claim_key(claim)[1] for claim in claims]
        try:
            answer = await self._call(driver, "NodePrepareResources", claims)
        except (DraKubeletError, grpc.aio.AioRpcError) as exc:
            return dict.fromkeys(uids, _call_error("NodePrepareResources", exc))
        unknown = sorted(set(answer.claims) - set(uids))
        if unknown:
            error = f"NodePrepareResources returned result for unknown claim UID {unknown[0]}"
            return dict.fromkeys(uids, error)
        return {uid: _prepared(driver, answer.claims.get(uid)) for uid in uids}

    async def _unprepare_on(self, driver: str, claims: list[Obj]) -> dict[str, str]:
        errors = await self._unprepare_answers(driver, claims)
        self.calls.append(Call("NodeUnprepareResources", driver, dict(errors)))
        return errors

    async def _unprepare_answers(self, driver: str, claims: list[Obj]) -> dict[str, str]:
        uids = [claim_key(claim)[1] for claim in claims]
        try:
            answer = await self._call(driver, "NodeUnprepareResources", claims)
        except (DraKubeletError, grpc.aio.AioRpcError) as exc:
            return dict.fromkeys(uids, _call_error("NodeUnprepareResources", exc))
        left_out = "NodeUnprepareResources left the claim out of its answer"
        return {
            uid: str(answer.claims[uid].error) if uid in answer.claims else left_out for uid in uids
        }

    async def _call(self, driver: str, method: str, claims: list[Obj]) -> Any:
        plugin = self._plugin(driver)
        pb, stub_class = SERVICES[plugin.service]
        request = getattr(pb, f"{method}Request")(
            claims=[
                pb.Claim(namespace=namespace, uid=uid, name=name)
                for namespace, uid, name in map(claim_key, claims)
            ]
        )
        rpc = getattr(stub_class(plugin.channel), method)
        try:
            return await rpc(request, timeout=self.call_timeout_s)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this call's caller is cancelled
            # grpc.aio cancels the calls of a closed channel: the plugin was deregistered
            # meanwhile (its registration socket went); the kubelet's call fails so
            raise DraKubeletError(
                f"{method} failed: CANCELLED: grpc: the client connection is closing"
            ) from None

    # -- pods ----------------------------------------------------------------------------

    async def run_pod(
        self, pod: Obj, claims: Mapping[str, Obj] | None = None
    ) -> dict[str, FakeContainer]:
        """Start a pod as the kubelet does: its claims (from ``claims``, keyed by the
        ResourceClaim's name or the pod's claim entry name, else read from the API server)
        prepared, then each container (init containers first) created with the CDI devices
        of the claims it references. PodStartError when a claim cannot be used or prepared;
        a container whose CDI devices cannot be injected has ``error`` set."""
        resolved = await self._pod_claims(pod, claims or {})
        prepared = await self._prepare_for_pod(pod, resolved)
        spec = pod["spec"]
        containers = [*(spec.get("initContainers") or []), *spec["containers"]]
        return {c["name"]: self._create_container(c, prepared) for c in containers}

    async def stop_pod(self, pod: Obj) -> dict[str, str]:
        """The pod is gone: unprepare the claims no other pod of this kubelet uses (their
        uid -> error, "" = done)."""
        pod_uid = pod["metadata"]["uid"]
        released = []
        for uid, record in list(self._claims.items()):
            if pod_uid not in record.pods:
                continue
            record.pods.discard(pod_uid)
            if not record.pods:
                released.append(record.claim)
                del self._claims[uid]
        return await self.unprepare(released) if released else {}

    async def _pod_claims(self, pod: Obj, given: Mapping[str, Obj]) -> dict[str, Obj]:
        """Pod claim entry name -> its ResourceClaim (entries that need none left out)."""
        found = {}
        for entry in pod["spec"].get("resourceClaims") or []:
            name = _claim_name(pod, entry)
            if name is None:
                continue
            claim = given.get(name) or given.get(entry["name"])
            if claim is None:
                claim = await self._fetch_claim(pod["metadata"].get("namespace", "default"), name)
            self._check_reserved(pod, claim)
            found[entry["name"]] = claim
        return found

    def _check_reserved(self, pod: Obj, claim: Obj) -> None:
        meta = pod["metadata"]
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        if self.check_reserved_for and all(r.get("uid") != meta["uid"] for r in reserved):
            raise PodStartError(
                f"pod {meta['name']}({meta['uid']}) is not allowed to use resource claim "
                f"{claim['metadata']['name']}"
            )

    async def _fetch_claim(self, namespace: str, name: str) -> Obj:
        if self.api_url is None:
            raise PodStartError(f"ResourceClaim {namespace}/{name} not given and no API server")
        if self._http is None:
            self._http = aiohttp.ClientSession()
        url = f"{self.api_url}/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with self._http.get(url, headers=headers, ssl=self.api_ssl) as response:
            if response.status != 200:
                text = (await response.text())[:300]
                raise PodStartError(
                    f"fetch ResourceClaim {namespace}/{name}: HTTP {response.status}: {text}"
                )
            claim: Obj = await response.json()
            return claim

    async def _prepare_for_pod(
        self, pod: Obj, claims: dict[str, Obj]
    ) -> dict[str, list[PreparedDevice]]:
        """Prepare the claims not prepared on this node yet; the pod is recorded as using
        all of them first, so that stopping it unprepares them even after a failure."""
        pod_uid = pod["metadata"]["uid"]
        pending: dict[str, Obj] = {}
        for claim in claims.values():
            uid = claim_key(claim)[1]
            record = self._claims.setdefault(uid, _ClaimRecord(claim))
            record.pods.add(pod_uid)
            if record.devices is None:
                pending[uid] = claim
        results = await self.prepare(list(pending.values())) if pending else {}
        errors = []
        for uid, claim in pending.items():
            result = results[uid]
            if isinstance(result, str):
                namespace, _, name = claim_key(claim)
                errors.append(f"NodePrepareResources failed for claim {namespace}/{name}: {result}")
            else:
                self._claims[uid].devices = result
        if errors:
            raise PodStartError("prepare dynamic resources: " + "; ".join(errors))
        return {
            entry: self._claims[claim_key(claim)[1]].devices or []
            for entry, claim in claims.items()
        }

    def _create_container(
        self, container: Obj, prepared: dict[str, list[PreparedDevice]]
    ) -> FakeContainer:
        ids: list[str] = []
        for ref in (container.get("resources") or {}).get("claims") or []:
            for device in prepared.get(ref["name"], []):
                if device.serves(ref.get("request")):
                    ids.extend(device.cdi_device_ids)
        created = FakeContainer(container["name"], env=_spec_env(container))
        created.cdi_ids = list(dict.fromkeys(ids))
        registry, self.cdi_errors = load_cdi_registry(self.cdi_dirs)
        try:
            inject_cdi(created, created.cdi_ids, registry)
        except CdiError as exc:
            created.error = f"CDI device injection failed: {exc}"
        return created


async def _close(plugin: _Plugin) -> None:
    if plugin.health_task is not None:
        plugin.health_task.cancel()
        await asyncio.wait([plugin.health_task])
    await plugin.channel.close(grace=None)


async def _notify(stub: reg_grpc.RegistrationStub, registered: bool, error: str) -> None:
    status = reg.RegistrationStatus(plugin_registered=registered, error=error)
    await stub.NotifyRegistrationStatus(status, timeout=NOTIFY_TIMEOUT_S)


def _call_error(method: str, exc: Exception) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{method} failed: {exc.code().name}: {exc.details()}"
    return str(exc)


def _prepared(driver: str, answer: Any) -> ClaimResult:
    if answer is None:
        return "NodePrepareResources left the claim out of its answer"
    if answer.error:
        return str(answer.error)
    return [
        PreparedDevice(
            request_names=tuple(d.request_names),
            pool_name=d.pool_name,
            device_name=d.device_name,
            cdi_device_ids=tuple(d.cdi_device_ids),
            share_id=_share_id(d),
            driver=driver,
        )
        for d in answer.devices
    ]


def _share_id(device: Any) -> str | None:
    """The optional ``share_id`` (v1 only: v1beta1 has no such field)."""
    if "share_id" not in device.DESCRIPTOR.fields_by_name or not device.HasField("share_id"):
        return None
    return str(device.share_id)


def _claim_name(pod: Obj, entry: Obj) -> str | None:
    """The ResourceClaim a pod's claim entry names: directly, or (from a template) through
    ``status.resourceClaimStatuses``; None when the pod needs no claim for it."""
    if entry.get("resourceClaimName"):
        return str(entry["resourceClaimName"])
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    for status in statuses:
        if status.get("name") == entry["name"]:
            return status.get("resourceClaimName") or None
    meta = pod["metadata"]
    raise PodStartError(
        f"pod {meta.get('namespace', 'default')}/{meta['name']}: the ResourceClaim of "
        f"pod claim {entry['name']} has not been created yet"
    )


def _spec_env(container: Obj) -> dict[str, str]:
    return {
        e["name"]: str(e.get("value", ""))
        for e in container.get("env") or []
        if "valueFrom" not in e
    }


# -- CDI, as the container runtimes' CDI cache reads and applies it ---------------------------
# A spec file is ignored (``cdi_errors`` says why) when it does not parse, has no valid
# cdiVersion or kind, no devices, a device with a bad or repeated name or with no edits of
# its own, an env entry without "=", a device node without path, a mount without paths, or
# a cdiVersion lower than what it uses needs (0.5.0 for names starting with a digit).

CDI_VERSION_RE = re.compile(r"\d+\.\d+\.\d+")
CDI_KIND_RE = re.compile(
    r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
)
CDI_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
CDI_EDIT_KEYS = ("env", "deviceNodes", "mounts", "hooks", "intelRdt", "additionalGids")


@dataclass(frozen=True)
class CdiDevice:
    spec_path: Path
    priority: int  # index of its directory: a later one wins
    spec: Obj
    device: Obj


def load_cdi_registry(
    dirs: Iterable[Path | str],
) -> tuple[dict[str, CdiDevice], dict[str, str]]:
    """``vendor/class=name`` -> its device, from the ``*.json``/``*.yaml`` files of ``dirs``
    (no recursion; a device in a later directory replaces one in an earlier; one defined
    twice in the same directory is dropped as a conflict), and the files ignored -> why."""
    devices: dict[str, CdiDevice] = {}
    conflicts: set[str] = set()
    errors: dict[str, str] = {}
    for priority, directory in enumerate(map(Path, dirs)):
        for path in _spec_files(directory):
            try:
                spec = _read_spec(path)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                errors[str(path)] = str(exc)
                continue
            for device in spec["devices"]:
                name = f"{spec['kind']}={device['name']}"
                old = devices.get(name)
                if old is not None and old.priority == priority:
                    conflicts.add(name)
                devices[name] = CdiDevice(path, priority, spec, device)
    for name in conflicts:
        devices.pop(name, None)
    return devices, errors


def inject_cdi(
    container: FakeContainer, ids: Sequence[str], registry: Mapping[str, CdiDevice]
) -> None:
    """Apply the edits of these devices (each spec's own edits once, before its first
    device's); CdiError naming the ids that resolve to no device."""
    unresolved = [cdi_id for cdi_id in ids if cdi_id not in registry]
    if unresolved:
        raise CdiError(f"unresolvable CDI devices {', '.join(unresolved)}")
    applied: set[Path] = set()
    for cdi_id in ids:
        found = registry[cdi_id]
        if found.spec_path not in applied:
            applied.add(found.spec_path)
            _apply_edits(container, found.spec.get("containerEdits") or {})
        _apply_edits(container, found.device.get("containerEdits") or {})


def _apply_edits(container: FakeContainer, edits: Obj) -> None:
    """Env ``K=V`` (a later key wins), mounts (by container path) and device nodes (by
    path, ``hostPath`` defaulting to it), a later one replacing an earlier."""
    for entry in edits.get("env") or []:
        key, _, value = entry.partition("=")
        container.env[key] = value
    for mount in edits.get("mounts") or []:
        kept = [m for m in container.mounts if m["containerPath"] != mount["containerPath"]]
        container.mounts = [*kept, dict(mount)]
    for node in edits.get("deviceNodes") or []:
        kept = [n for n in container.device_nodes if n["path"] != node["path"]]
        container.device_nodes = [*kept, {**node, "hostPath": node.get("hostPath") or node["path"]}]


def _spec_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in (".json", ".yaml") and p.is_file())


def _read_spec(path: Path) -> Obj:
    text = path.read_text()
    spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    problem = _spec_problem(spec)
    if problem:
        raise ValueError(f"invalid CDI Spec {path.name}: {problem}")
    assert isinstance(spec, dict)
    return spec


def _spec_problem(spec: object) -> str | None:
    if not isinstance(spec, dict):
        return "not a mapping"
    version, kind = spec.get("cdiVersion"), spec.get("kind")
    if not isinstance(version, str) or not CDI_VERSION_RE.fullmatch(version):
        return f"invalid cdiVersion {version!r}"
    if not isinstance(kind, str) or not CDI_KIND_RE.fullmatch(kind):
        return f"invalid kind {kind!r}"
    problem = _devices_problem(spec.get("devices")) or _edits_problem(
        spec.get("containerEdits") or {}
    )
    if problem:
        return problem
    needed = _required_version(spec)
    if _version(version) < needed:
        return f"cdiVersion {version} is below {'.'.join(map(str, needed))}, which it needs"
    return None


def _devices_problem(devices: object) -> str | None:
    if not isinstance(devices, list) or not devices:
        return "invalid spec, no devices"
    seen = set()
    for device in devices:
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or not CDI_NAME_RE.fullmatch(name):
            return f"invalid device name {name!r}"
        if name in seen:
            return f"invalid spec, multiple device {name!r}"
        seen.add(name)
        edits = device.get("containerEdits") or {}
        if not isinstance(edits, dict) or not any(edits.get(k) for k in CDI_EDIT_KEYS):
            return f"failed add device {name!r}: invalid device, empty device edits"
        if problem := _edits_problem(edits):
            return f"invalid device {name!r}: {problem}"
    return None


def _edits_problem(edits: object) -> str | None:
    if not isinstance(edits, dict):
        return "containerEdits is not a mapping"
    for entry in edits.get("env") or []:
        if not isinstance(entry, str) or "=" not in entry:
            return f"invalid environment variable {entry!r}"
    for node in edits.get("deviceNodes") or []:
        if not isinstance(node, dict) or not node.get("path"):
            return "invalid (empty) device path"
        if set(node.get("permissions", "")) - set("rwm"):
            return f"invalid device permissions {node['permissions']!r}"
    for mount in edits.get("mounts") or []:
        if not isinstance(mount, dict) or not mount.get("hostPath"):
            return "invalid mount, empty host path"
        if not mount.get("containerPath"):
            return "invalid mount, empty container path"
    return None


def _required_version(spec: Obj) -> tuple[int, ...]:
    """The lowest cdiVersion that allows what the spec uses (device names not starting
    with a letter and device node ``hostPath``: 0.5.0; mount ``type``: 0.4.0)."""
    all_edits = [spec.get("containerEdits") or {}]
    all_edits += [d.get("containerEdits") or {} for d in spec["devices"]]
    nodes = [n for e in all_edits for n in e.get("deviceNodes") or []]
    mounts = [m for e in all_edits for m in e.get("mounts") or []]
    if any(d["name"][0] not in string.ascii_letters for d in spec["devices"]):
        return (0, 5, 0)
    if any(n.get("hostPath") for n in nodes):
        return (0, 5, 0)
    if any(m.get("type") for m in mounts):
        return (0, 4, 0)
    return (0, 3, 0)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))
