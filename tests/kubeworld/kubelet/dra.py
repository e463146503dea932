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
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio

from agent.dra.proto import registration_pb2 as reg
from tests.kubeworld.kubelet.cdi import inject_cdi, load_cdi_registry
from tests.kubeworld.kubelet.plugins import (
    CALL_TIMEOUT_S,
    DEFAULT_CDI_DIRS,
    HEALTH_RETRY_S,
    HEALTH_TIMEOUT_S,
    SERVICES,
    Call,
    CdiError,
    ClaimResult,
    DraKubeletError,
    FakeContainer,
    Obj,
    PodStartError,
    PreparedDevice,
    Retry,
    _call_error,
    _claim_name,
    _ClaimRecord,
    _DeviceHealth,
    _Plugin,
    _prepared,
    _Retry,
    _spec_env,
    claim_drivers,
    claim_key,
)
from tests.kubeworld.kubelet.registration import PluginWatcher


class DraKubelet(PluginWatcher):
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
