"""A stand-in for an unmodified kube-scheduler (DynamicResources plugin, consumable capacity,
binding conditions, extended-resource mapping) and for kube-controller-manager's
resourceclaim controller, for the pods of ``default-scheduler`` (or no scheduler name) that
use DRA: claims in ``spec.resourceClaims``, or a container's extended resource that a
DeviceClass maps (``spec.extendedResourceName``, or the implicit
``deviceclass.resource.kubernetes.io/<class>``).

    async with DraSchedulerStandIn(api.url, token="t", binding_timeout_s=2) as scheduler:
        task = asyncio.create_task(scheduler.run())
        ...  # scheduler.bound, scheduler.failures, scheduler.attempts

One attempt for one pod (:meth:`DraSchedulerStandIn.schedule`):

1. The resourceclaim controller: a claim made from each ``resourceClaimTemplateName``
   (``generateName: <pod>-<claim>-``, owned by the pod, annotated
   ``resource.kubernetes.io/pod-claim-name``), recorded in
   ``status.resourceClaimStatuses``; an existing one (found by owner and annotation) is
   reused. KEP-5004: one claim for the extended resources (``generateName:
   <pod>-extended-resources-``, annotated ``resource.kubernetes.io/extended-resource-claim:
   "true"``, one ExactCount request ``container-<i>-request-<j>`` per container and
   resource, no capacity requests), recorded in ``status.extendedResourceClaimStatus``.
2. Scheduling cycle: nodes, ResourceSlices and DeviceClasses are listed; the claims come
   from an informer (:class:`ClaimIndex`: every claim listed once, then watched, indexed by
   owner pod and by the pools of their devices, as kube-scheduler's informers and the
   claims' tracker do; every claim this stand-in writes goes in with the write's answer),
   so an attempt reads only the claims of the pod and of each node's pools, never all of
   them. The claims this stand-in allocated and has not yet seen back (its assume cache,
   keyed by claim uid and compared by resourceVersion, as kube-scheduler's) overlay the
   informer's. The nodes, shuffled, are tried with
   :func:`tests.kubeworld.scheduler.allocator.allocate`;
   the first that fits wins. Decisions are serialized (one lock), so concurrent pods
   never count the same capacity twice; everything else runs concurrently.
3. PreBind: each claim's ``status.allocation`` and ``status.reservedFor`` are written with a
   PUT of ``/status`` under its resourceVersion (a 409: read again, apply again). With
   binding conditions the claim is read every ``poll_s`` until, for each such result, a
   ``status.devices`` entry of the same driver, pool, device (and shareID when the result
   has one) has every condition True; a True failure condition ("binding failed:
   reason=..., message=...") or ``binding_timeout_s`` ("device binding timeout") ends the
   wait: the pod is taken out of ``reservedFor``, a claim reserved for nobody else is
   deallocated (allocation, reservedFor and device statuses cleared), a FailedScheduling
   event is recorded, and the pod is tried again after ``backoff_s``.
4. Binding: ``POST pods/<name>/binding``.

Where it differs from kube-scheduler:

- After a failed binding it leaves that node out of the pod's next attempt (once).
  kube-scheduler does not: it requeues the pod, deallocates in PostFilter, and relies on
  the driver having tainted or withdrawn the refused device (as gpushare's agent does), so
  the next cycle does not pick it again.
- The extended-resource claim is created before allocation and kept (deallocated) after a
  failed binding; kube-scheduler writes it in PreBind with its allocation and deletes it
  when the pod cannot use it. Device-plugin extended resources are not considered.
- No scoring (the first fitting node of a shuffled order), no preemption, no node
  filters other than the claims' (no taints, affinity or node resources), no claim
  finalizer, and the binding timeout runs from the start of the wait rather than from
  ``allocationTimestamp`` (whole seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from typing import Any

import aiohttp

from tests.kubeworld.scheduler.allocator import (
    AllocationError,
    allocate,
    pool_keys,
)
from tests.kubeworld.scheduler.claims import (
    EXTENDED_ANNOTATION,
    LEFT_OUT,
    MERGE_PATCH,
    POD_CLAIM_ANNOTATION,
    RESOURCE_API,
    SCHEDULER,
    UNBOUND,
    WRITE_TRIES,
    ExtendedRequest,
    Obj,
    _tasks,
    allocation_of,
    allows_node,
    annotation,
    binding,
    binding_state,
    claim_from_template,
    claim_path,
    claims_path,
    extended_claim,
    extended_requests,
    mine,
    name_of,
    pod_key,
    pod_path,
    reserve,
    results_of,
    uid_of,
    unavailable,
    version_of,
)
from tests.kubeworld.scheduler.extender import failed_scheduling
from tests.kubeworld.scheduler.informer import (
    ApiStatus,
    Assumed,
    ClaimIndex,
    ClaimInformer,
    ClaimView,
)


class AttemptFailed(Exception):
    """This attempt of this pod ends; ``str()`` is the FailedScheduling message."""


class DraSchedulerStandIn(ClaimInformer):
    """See the module's text. ``attempts``: scheduling attempts per "namespace/name";
    ``bound``: the node of each pod it bound; ``failures``: (pod, FailedScheduling message)
    in order. :meth:`run` schedules until cancelled; :meth:`schedule` is one attempt."""

    def __init__(
        self,
        api_url: str,
        *,
        token: str = "",
        binding_timeout_s: float = 10.0,
        poll_s: float = 0.2,
        backoff_s: float = 0.3,
        seed: int | None = None,
    ) -> None:
        self.api_url = api_url
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.binding_timeout_s, self.poll_s, self.backoff_s = binding_timeout_s, poll_s, backoff_s
        self.rng = random.Random(seed)
        self.session: aiohttp.ClientSession | None = None
        self.attempts: Counter[str] = Counter()  # "namespace/name" -> scheduling attempts
        self.bound: dict[str, str] = {}  # "namespace/name" -> node
        self.failures: list[tuple[str, str]] = []  # ("namespace/name", FailedScheduling message)
        self._assumed: dict[str, Assumed] = {}  # claim uid ->
        self._decide = asyncio.Lock()
        self._excluded: dict[str, set[str]] = {}  # pod uid -> nodes left out of its next try
        self._waiting: dict[str, Obj] = {}  # pod uid -> pod, kept by follow()
        self._ignored: set[str] = set()  # uids of pods found to use no DRA
        self._synced = asyncio.Event()
        self.index = ClaimIndex()  # kept by follow_claims() while run() runs
        self._indexed = asyncio.Event()  # set once the claims were listed
        self._informing = False

    async def __aenter__(self) -> DraSchedulerStandIn:
        self.session = aiohttp.ClientSession(headers=self.headers)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    # -- HTTP ------------------------------------------------------------------------------

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Obj | None = None,
        patch: bool = False,
    ) -> Obj:
        """One request; the answer (a JSON object), or :class:`ApiStatus`."""
        assert self.session is not None
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": MERGE_PATCH if patch else "application/json"}
        async with self.session.request(
            method, self.api_url + path, data=data, headers=headers, params=params
        ) as response:
            text = await response.text()
            answer: Obj = json.loads(text) if text else {}
            if response.status >= 300:
                raise ApiStatus(response.status, answer)
            return answer

    async def items(self, path: str) -> list[Obj]:
        listing = await self.call("GET", path)
        return list(listing.get("items") or [])

    async def follow(self) -> None:
        """The informer: unbound pods of this scheduler that use DRA, listed then watched
        (listed again when a watch ends)."""
        assert self.session is not None
        forever = aiohttp.ClientTimeout(total=None, sock_read=None)
        while True:
            try:
                listing = await self.call("GET", "/api/v1/pods", params={"fieldSelector": UNBOUND})
                self._waiting = {p["metadata"]["uid"]: p for p in listing["items"] if mine(p)}
                self._synced.set()
                watch = {
                    "fieldSelector": UNBOUND,
                    "watch": "true",
                    "resourceVersion": listing["metadata"]["resourceVersion"],
                    "timeoutSeconds": "60",
                }
                url = f"{self.api_url}/api/v1/pods"
                async with self.session.get(url, params=watch, timeout=forever) as response:
                    response.raise_for_status()
                    async for line in response.content:
                        if not self._seen(json.loads(line)):
                            break
            except (aiohttp.ClientError, ApiStatus, TimeoutError, ValueError):
                await asyncio.sleep(self.poll_s)

    def _seen(self, event: Obj) -> bool:
        """Apply one watch event; False when the watch must list again."""
        if event["type"] == "ERROR":
            return False
        pod = event["object"]
        if event["type"] == "DELETED":
            self._waiting.pop(pod["metadata"]["uid"], None)
        elif event["type"] in ("ADDED", "MODIFIED") and mine(pod):
            self._waiting[pod["metadata"]["uid"]] = pod
        return True

    async def pending(self) -> list[Obj]:
        await self._synced.wait()
        return [
            p
            for p in self._waiting.values()
            if not p["metadata"].get("deletionTimestamp")
            and pod_key(p) not in self.bound
            and p["metadata"]["uid"] not in self._ignored
        ]

    async def run(self, *, concurrency: int = 16) -> None:
        """Schedule pending pods until cancelled, each pod's attempts one after another
        (``backoff_s`` apart), up to ``concurrency`` pods at once."""
        busy: set[str] = set()
        limit = asyncio.Semaphore(concurrency)

        async def cycle(pod: Obj) -> None:
            try:
                async with limit:
                    node = await self.schedule(pod)
                if node is None:
                    await asyncio.sleep(self.backoff_s)
            except (aiohttp.ClientError, ApiStatus, TimeoutError):
                await asyncio.sleep(self.backoff_s)
            finally:
                busy.discard(pod["metadata"]["uid"])

        async with _tasks() as spawn, _tasks() as informer:
            informer(self.follow_claims())
            informer(self.follow())
            while True:
                for pod in await self.pending():
                    if pod["metadata"]["uid"] not in busy:
                        busy.add(pod["metadata"]["uid"])
                        spawn(cycle(pod))
                await asyncio.sleep(0.02)

    # -- one attempt -----------------------------------------------------------------------

    async def schedule(self, pod: Obj) -> str | None:
        """One attempt: the node the pod was bound to, or None (a FailedScheduling event
        says why)."""
        pod = await self.call("GET", pod_path(pod))
        if pod["spec"].get("nodeName"):
            return str(pod["spec"]["nodeName"])
        self.attempts[pod_key(pod)] += 1
        try:
            claims = await self.ensure_claims(pod)
            if not claims:
                self._ignored.add(pod["metadata"]["uid"])  # no DRA: not this stand-in's pod
                return None
            node, reserved = await self.place(pod, claims)
            await self.prebind(pod, node, reserved)
            await self.bind(pod, node)
        except AttemptFailed as exc:
            await self.failed(pod, str(exc))
            return None
        self.bound[pod_key(pod)] = node
        return node

    async def bind(self, pod: Obj, node: str) -> None:
        try:
            await self.call("POST", f"{pod_path(pod)}/binding", binding(pod, node))
        except ApiStatus as exc:
            now = await self.call("GET", pod_path(pod))
            if exc.code != 409 or now["spec"].get("nodeName") != node:
                raise AttemptFailed(f"binding rejected: {exc}") from None

    async def failed(self, pod: Obj, message: str) -> None:
        self.failures.append((pod_key(pod), message))
        meta = pod["metadata"]
        event = failed_scheduling(pod, message, SCHEDULER)
        with contextlib.suppress(ApiStatus):
            await self.call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", event)

    # -- the resourceclaim controller ------------------------------------------------------

    async def ensure_claims(self, pod: Obj) -> list[Obj]:
        """The pod's claims (made from templates and for extended resources when missing,
        and recorded in the pod's status)."""
        owned = (await self.claim_index()).owned_by(pod)
        status: Obj = {}
        claims, statuses = [], []
        for entry in pod["spec"].get("resourceClaims") or []:
            claim = await self._pod_claim(pod, entry, owned)
            claims.append(claim)
            if entry.get("resourceClaimTemplateName"):
                statuses.append({"name": entry["name"], "resourceClaimName": name_of(claim)})
        if statuses != (pod.get("status") or {}).get("resourceClaimStatuses", []):
            status["resourceClaimStatuses"] = statuses
        extended = extended_requests(pod, await self.items(f"{RESOURCE_API}/deviceclasses"))
        if extended:
            claim, recorded = await self._extended_claim(pod, extended, owned)
            claims.append(claim)
            if recorded != (pod.get("status") or {}).get("extendedResourceClaimStatus"):
                status["extendedResourceClaimStatus"] = recorded
        if status:
            await self.call("PATCH", f"{pod_path(pod)}/status", {"status": status}, patch=True)
        return claims

    async def _pod_claim(self, pod: Obj, entry: Obj, owned: list[Obj]) -> Obj:
        namespace = pod["metadata"]["namespace"]
        if name := entry.get("resourceClaimName"):
            return await self._get_claim(namespace, name)
        for claim in owned:
            if annotation(claim, POD_CLAIM_ANNOTATION) == entry["name"]:
                return claim
        template_name = entry.get("resourceClaimTemplateName", "")
        path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates/{template_name}"
        try:
            template = await self.call("GET", path)
        except ApiStatus as exc:
            raise AttemptFailed(f"resourceclaimtemplate {template_name!r}: {exc}") from None
        claim = claim_from_template(pod, entry["name"], template)
        return self._learn(await self.call("POST", claims_path(namespace), claim))

    async def _extended_claim(
        self, pod: Obj, extended: list[ExtendedRequest], owned: list[Obj]
    ) -> tuple[Obj, Obj]:
        found = [c for c in owned if annotation(c, EXTENDED_ANNOTATION) == "true"]
        claim = found[0] if found else None
        if claim is None:
            body = extended_claim(pod, extended)
            path = claims_path(pod["metadata"]["namespace"])
            claim = self._learn(await self.call("POST", path, body))
        mapping = [
            {
                "containerName": e.container,
                "extendedResourceName": e.resource,
                "requestName": e.request,
            }
            for e in extended
        ]
        return claim, {"resourceClaimName": name_of(claim), "requestMapping": mapping}

    async def _get_claim(self, namespace: str, name: str) -> Obj:
        try:
            return await self.call("GET", f"{claims_path(namespace)}/{name}")
        except ApiStatus as exc:
            if exc.code == 404:
                raise AttemptFailed(f'resourceclaim "{name}" not found') from None
            raise

    # -- the scheduling cycle --------------------------------------------------------------

    async def place(self, pod: Obj, claims: list[Obj]) -> tuple[str, list[Obj]]:
        """The node, and the pod's claims allocated there and reserved for the pod (in the
        assume cache), or :class:`AttemptFailed`."""
        excluded = self._excluded.pop(pod["metadata"]["uid"], set())
        async with self._decide:
            nodes, slices, classes, index = await asyncio.gather(
                self.items("/api/v1/nodes"),
                self.items(f"{RESOURCE_API}/resourceslices"),
                self.items(f"{RESOURCE_API}/deviceclasses"),
                self.claim_index(),
            )
            view = self._overlay(index)
            mine_now = [view.current(c) for c in claims]
            names = [n["metadata"]["name"] for n in nodes]
            self.rng.shuffle(names)
            reasons: dict[str, str] = {}
            for node in names:
                if node in excluded:
                    reasons[node] = LEFT_OUT
                    continue
                placed = self._try_node(pod, node, mine_now, view, slices, classes)
                if isinstance(placed, str):
                    reasons[node] = placed
                    continue
                for claim in placed:
                    self._assumed[uid_of(claim)] = Assumed(claim)
                return node, placed
        raise AttemptFailed(unavailable(len(names), reasons))

    def _try_node(
        self,
        pod: Obj,
        node: str,
        claims: list[Obj],
        view: ClaimView,
        slices: list[Obj],
        classes: list[Obj],
    ) -> list[Obj] | str:
        """The claims allocated on ``node`` and reserved for ``pod``, or why not."""
        fixed = [c for c in claims if allocation_of(c)]
        if not all(allows_node(allocation_of(c), node) for c in fixed):
            return "node(s) didn't match the allocated claims' node selector"
        todo = [c for c in claims if not allocation_of(c)]
        todo_uids = {uid_of(c) for c in todo}
        others = view.in_pools(pool_keys(slices, node), leaving_out=todo_uids)
        try:
            allocations = allocate(todo, node, slices=slices, classes=classes, allocated=others)
        except AllocationError as exc:
            return str(exc)
        made = {uid_of(c): a for c, a in zip(todo, allocations, strict=True)}
        return [reserve(c, made.get(uid_of(c)) or allocation_of(c), pod) for c in claims]

    def _overlay(self, index: ClaimIndex) -> ClaimView:
        """The index's claims, with the assumed ones in place of older copies (an assumed
        claim is forgotten once the index shows its write, or it is gone)."""
        assumed_now: dict[str, Obj] = {}
        for uid, assumed in list(self._assumed.items()):
            current = index.claims.get(uid)
            landed = assumed.version is not None
            if current is None or (landed and version_of(current) >= (assumed.version or 0)):
                if landed:
                    del self._assumed[uid]  # shown (or gone): the index is as new
                continue
            assumed_now[uid] = assumed.claim
        return ClaimView(index, assumed_now)

    # -- PreBind ---------------------------------------------------------------------------

    async def prebind(self, pod: Obj, node: str, claims: list[Obj]) -> None:
        """The claims written, then their binding conditions waited for; on failure the
        claims are released and the node is left out of the pod's next attempt."""
        written: list[Obj] = []
        try:
            for claim in claims:
                written.append(await self._write(claim, pod))
        except (ApiStatus, AttemptFailed) as exc:
            for claim in claims[len(written) :]:
                self._assumed.pop(uid_of(claim), None)
            await self._release_all(written, pod)
            raise AttemptFailed(f"could not write the claims' allocation: {exc}") from None
        problem = await self.binding_outcome(written)
        if problem is not None:
            await self._release_all(written, pod)
            self._excluded[pod["metadata"]["uid"]] = {node}
            raise AttemptFailed(problem)

    async def _write(self, claim: Obj, pod: Obj) -> Obj:
        """PUT ``claim``'s status; on a 409 read it again and reserve again (the same
        allocation, or none yet)."""
        uid, body = uid_of(claim), claim
        for _ in range(WRITE_TRIES):
            try:
                written = await self.call("PUT", f"{claim_path(body)}/status", body)
            except ApiStatus as exc:
                if exc.code != 409:
                    self._assumed.pop(uid, None)
                    raise
                fresh = await self.call("GET", claim_path(claim))
                current = allocation_of(fresh)
                if current and current != allocation_of(claim):
                    self._assumed.pop(uid, None)
                    raise AttemptFailed("the claim was allocated meanwhile") from None
                body = reserve(fresh, allocation_of(claim), pod)
                continue
            self._assumed[uid] = Assumed(written, version_of(written))
            return self._learn(written)
        self._assumed.pop(uid, None)
        raise AttemptFailed(f"claim {name_of(claim)}: too many conflicts")

    async def binding_outcome(self, claims: list[Obj]) -> str | None:
        """None once every result with binding conditions is ready; otherwise why not."""
        waiting = [c for c in claims if any(r.get("bindingConditions") for r in results_of(c))]
        deadline = time.monotonic() + self.binding_timeout_s
        while waiting:
            states = [binding_state(await self.call("GET", claim_path(c))) for c in waiting]
            if refusal := next((s for s in states if s not in ("ready", "pending")), None):
                return refusal
            waiting = [c for c, s in zip(waiting, states, strict=True) if s == "pending"]
            if waiting and time.monotonic() >= deadline:
                return "device binding timeout"
            if waiting:
                await asyncio.sleep(self.poll_s)
        return None

    async def _release_all(self, claims: list[Obj], pod: Obj) -> None:
        for claim in claims:
            self._assumed.pop(uid_of(claim), None)
            with contextlib.suppress(ApiStatus):
                await self._release(claim, pod)

    async def _release(self, claim: Obj, pod: Obj) -> None:
        """Take the pod out of ``reservedFor``; a claim reserved for nobody is deallocated."""
        for _ in range(WRITE_TRIES):
            fresh = await self.call("GET", claim_path(claim))
            status = dict(fresh.get("status") or {})
            kept = [r for r in status.get("reservedFor") or [] if r.get("uid") != uid_of(pod)]
            status["reservedFor"] = kept
            if not kept:
                status = {
                    k: v
                    for k, v in status.items()
                    if k not in ("allocation", "reservedFor", "devices")
                }
            try:
                body = {**fresh, "status": status}
                self._learn(await self.call("PUT", f"{claim_path(fresh)}/status", body))
                return
            except ApiStatus as exc:
                if exc.code != 409:
                    raise
