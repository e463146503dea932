"""The claims' reconcile: a lease of a claim that no longer exists, or is no longer
allocated to this node, is released and its CDI spec removed (a pod force-deleted, a
claim deallocated after its binding answer, an Unprepare that never came).

It works from the node, never from a cluster list or watch: the claims it checks are
those of the node's live DRA leases and of its kept specs, each read with one GET by the
name the node's claim index keeps (:mod:`agent.claims.index`). A pass costs one GET
per claim of the node, whatever the cluster holds. A claim gone (404), replaced (another
UID under its name) or no longer allocated here (no result of this driver in this pool)
loses its leases (only those older than the pass's start, checked again under the claim's
lock) and, once it holds none, its spec and its index entry. A read that fails (5xx, a
timeout) or a claim that cannot be decoded leaves the claim for the next pass. Index
entries of claims that hold neither a lease nor a spec (a Prepare or a binding answer that
admitted nothing) are removed.

A pass also keeps the pods each claim is reserved for (whom a shared claim's processes
belong to, :class:`agent.claims.users.ClaimPods`), and reads once each pod that joined a
claim already admitted: one that runs as another user than the claim's shares is told
(``dra.user_conflict``), as its processes would wait for the MPS server of that user. A
pass costs one GET more per such pod, once.

Leases of the previous release have no index entry. Their claim's name is found once, then
written to the index: through the lease's pod (``Lease.pod``: its ``status.
resourceClaimStatuses`` and ``spec.resourceClaims`` name its claims; each named one is
read until one has the UID), else from the ResourceClaims of the lease's namespace
(``Lease.tenant``): one namespaced list per namespace and pass for all such leases of it.
That fallback's cost grows with the namespace's claims, and only leases made before this
release pay it, once. A kept spec of the previous release with no live lease (an
``adminAccess`` claim's) has no name to read it by and is left to its Unprepare.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.aio.section import run_to_end
from agent.claims.driver import ClaimDriver
from agent.claims.index import ClaimName
from agent.claims.shares import claim_uid_of, share_of
from agent.claims.users import claim_key, joined_message, pods_users
from agent.core.errors import GpushareError, StateError
from agent.core.lease import Lease
from agent.dra.claims import ClaimError, metadata, results_here
from agent.kubeapi.port import KubeError, NotFound, Obj, ResourceApi

log = logging.getLogger(__name__)


class Unread(Exception):
    """The claim could not be read this pass: left as it is."""


@dataclass(slots=True)
class _Pass:
    started: float
    listed: dict[str, dict[str, Obj]] = field(default_factory=dict)  # namespace -> uid -> claim
    unlisted: set[str] = field(default_factory=set)  # namespaces whose list failed


class Reconciler:
    def __init__(
        self,
        driver: ClaimDriver,
        api: ResourceApi,
        *,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._driver = driver
        self._api = api
        self._interval_s = interval_s
        self._clock = clock
        self.released = 0
        self.passes = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.once()
            except (GpushareError, OSError) as exc:  # the next pass tries again
                log.warning("claim reconcile failed: %s", exc)
            except Exception:
                log.exception("claim reconcile failed")

    async def once(self) -> None:
        """Check every claim of the node (its live leases' and its kept specs'), one read
        each; release what no claim allocates here any more."""
        now = _Pass(self._clock())
        specs = self._driver.specs
        leases: dict[str, list[Lease]] = {}
        for lease in self._driver.live_leases():
            uid = claim_uid_of(lease.request_id)
            if uid and lease.held_by_claim:
                leases.setdefault(uid, []).append(lease)
        kept, names = await asyncio.to_thread(lambda: (specs.claims(), specs.index.entries()))
        for uid in sorted(set(names) - set(leases) - kept):
            await self._sweep(uid, names[uid], now)
        for uid in sorted(set(leases) | kept):
            if uid not in leases and names.get(uid) is None:
                log.debug("claim %s: a spec without a lease or a name; left", uid)
                continue
            try:
                await self._check(uid, leases.get(uid, []), names.get(uid), now)
            except Unread as exc:
                log.info("claim %s not checked this pass: %s", uid, exc)
        self.passes += 1

    async def _check(
        self, uid: str, leases: list[Lease], name: ClaimName | None, now: _Pass
    ) -> None:
        if name is not None:
            claim = await self._get(name.namespace, name.name)
        else:
            claim = await self._find(uid, leases, now)
        if claim is not None and metadata(claim).get("uid") != uid:
            claim = None  # replaced: another claim of that name
        driver = self._driver
        if claim is not None:  # the pods its processes may run in now
            joined = driver.pods.saw(claim)
            if joined and leases and driver.user_rule_on(leases):
                await self._check_joined(claim, leases, joined)
        try:
            found = (
                [] if claim is None else results_here(claim, driver.driver_name, driver.node_name)
            )
        except ClaimError as exc:
            raise Unread(f"its allocation cannot be read: {exc}") from exc
        here = {s.key for s in found}
        if claim is not None and name is None:  # found otherwise: by name from now on
            meta = metadata(claim)
            await asyncio.to_thread(
                self._driver.specs.index.remember,
                uid,
                str(meta.get("namespace") or ""),
                str(meta.get("name") or ""),
            )
        stale = [
            x.lease_id
            for x in leases
            if share_of(x.request_id) not in here and x.updated_at < now.started
        ]
        if stale:
            await self._release(uid, stale, now.started)
        elif not here and not leases:
            await self._drop(uid, "its claim is gone from this node")

    async def _check_joined(
        self, claim: Obj, leases: list[Lease], joined: list[tuple[str, str]]
    ) -> None:
        """Pods that joined a claim already admitted (a shared claim's next user: no
        binding answer, no Prepare) are read once: ``dra.user_conflict`` when they run as
        another user than its shares, whose MPS server would keep them waiting."""
        share_uids = frozenset(x.run_as_uid for x in leases if x.run_as_uid is not None)
        if not share_uids:
            return
        try:
            users = await pods_users(self._api, claim, joined)
        except StateError as exc:  # read again by the next pass
            log.info("claim %s: its new pods not checked: %s", claim_key(claim), exc)
            return
        self._driver.pods.checked(claim, (uid for _, uid in joined))
        message = joined_message(claim_key(claim), users, share_uids)
        if message:
            log.warning("%s", message)
            self._driver.note("dra.user_conflict", message, claim)

    async def _get(self, namespace: str, name: str) -> Obj | None:
        """The claim of that name; None when there is none."""
        try:
            return await self._api.get_resource_claim(namespace, name)
        except NotFound:
            return None
        except KubeError as exc:
            raise Unread(f"reading claim {namespace}/{name} failed: {exc}") from exc

    async def _find(self, uid: str, leases: Sequence[Lease], now: _Pass) -> Obj | None:
        """A claim the index does not name (a lease of the previous release): through its
        leases' pods, else in the list of its namespace; None when that list proves it
        gone."""
        for pod in sorted({x.pod for x in leases if x.pod}):
            found = await self._through_pod(uid, pod)
            if found is not None:
                return found
        namespaces = sorted({x.tenant for x in leases if x.tenant})
        if not namespaces:
            raise Unread("no index entry, no lease to find its name by")
        for namespace in namespaces:
            listed = await self._listed(namespace, now)
            if uid in listed:
                return listed[uid]
        return None

    async def _through_pod(self, uid: str, pod: str) -> Obj | None:
        namespace, _, name = pod.partition("/")
        try:
            found = await self._api.get_pod(namespace, name)
        except NotFound:
            return None
        except KubeError as exc:
            raise Unread(f"reading pod {pod} failed: {exc}") from exc
        for claim_name in pod_claim_names(found):
            claim = await self._get(namespace, claim_name)
            if claim is not None and metadata(claim).get("uid") == uid:
                return claim
        return None

    async def _listed(self, namespace: str, now: _Pass) -> dict[str, Obj]:
        if namespace in now.unlisted:
            raise Unread(f"listing the claims of namespace {namespace} failed")
        if namespace not in now.listed:
            try:
                listing = await self._api.list_resource_claims(namespace=namespace)
            except KubeError as exc:
                now.unlisted.add(namespace)
                raise Unread(f"listing the claims of namespace {namespace} failed: {exc}") from exc
            now.listed[namespace] = {str(metadata(c).get("uid") or ""): c for c in listing.items}
        return now.listed[namespace]

    async def _release(self, uid: str, lease_ids: list[str], started: float) -> None:
        await run_to_end(
            self._release_locked(uid, lease_ids, started), what=f"reconcile of claim {uid}"
        )

    async def _release_locked(self, uid: str, lease_ids: list[str], started: float) -> None:
        """Under the claim's lock, the leases older than the pass that are still live, then
        its spec and index entry once it holds none, counted and told: as one unit (a stop
        in between would leave a spec and an entry of a claim without leases, or a release
        nobody explains)."""
        leases = self._driver.leases
        async with leases.claim_lock(uid):
            still = [
                x.lease_id
                for x in self._driver.live_leases()
                if x.lease_id in lease_ids and x.updated_at < started
            ]
            released = await leases.release(still, uid, "its claim is gone from this node")
            if not self._holds_leases(uid):
                self._forget(uid)
        self.released += len(released)
        if released:
            self._driver.note(
                "dra.claim_gone",
                f"claim {uid}: shares no longer allocated here; released {', '.join(released)}",
                {"metadata": {"uid": uid}},
            )

    async def _drop(self, uid: str, why: str) -> None:
        """A claim with a spec and no lease that is not allocated here: its spec and
        index entry go."""
        async with self._driver.leases.claim_lock(uid):
            if not self._holds_leases(uid):
                self._forget(uid)
                log.info("claim %s: spec removed (%s)", uid, why)

    async def _sweep(self, uid: str, name: ClaimName | None, now: _Pass) -> None:
        """An index entry of a claim with neither a lease nor a spec: removed, unless it
        was written after the pass began (a Prepare or an answer about to admit)."""
        if name is not None and name.at >= now.started:
            return
        async with self._driver.leases.claim_lock(uid):
            specs = self._driver.specs
            if self._holds_leases(uid) or uid in await asyncio.to_thread(specs.claims):
                return
            fresh = await asyncio.to_thread(specs.index.get, uid)
            if fresh is None or fresh.at < now.started:
                await asyncio.to_thread(specs.index.forget, uid)

    def _holds_leases(self, uid: str) -> bool:
        return any(
            claim_uid_of(x.request_id) == uid and x.held_by_claim
            for x in self._driver.live_leases()
        )

    def _forget(self, uid: str) -> None:
        """Spec first, then the name (a crash between leaves a name, swept later): unlinks,
        on the event loop."""
        self._driver.specs.remove(uid)
        self._driver.specs.index.forget(uid)


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The names of the ResourceClaims a pod uses: generated ones from its
    ``status.resourceClaimStatuses``, named ones from its ``spec.resourceClaims``, and the
    claim made for its extended resources."""
    status, spec = pod.get("status") or {}, pod.get("spec") or {}
    names = [
        str(s.get("resourceClaimName") or "") for s in status.get("resourceClaimStatuses") or []
    ]
    names += [str(c.get("resourceClaimName") or "") for c in spec.get("resourceClaims") or []]
    extended = status.get("extendedResourceClaimStatus") or {}
    names.append(str(extended.get("resourceClaimName") or ""))
    return list(dict.fromkeys(n for n in names if n))
