"""The DRA scheduler stand-in's view of the claims: an informer's (every claim listed once,
then watched, indexed by owner pod and by the pools of their devices) and its assume
cache's overlay on it for one attempt."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.kubeworld.scheduler.allocator import (
    claim_pool_keys,
)
from tests.kubeworld.scheduler.claims import (
    RESOURCE_API,
    Obj,
    claims_path,
    uid_of,
    version_of,
)


class ApiStatus(Exception):
    """An API answer other than 2xx."""

    def __init__(self, code: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        super().__init__(f"{code}: {message}")
        self.code, self.body = code, body


@dataclass
class Assumed:
    claim: Obj  # as this stand-in wrote it, or is writing it
    version: int | None = None  # the resourceVersion its write got (None: not landed yet)


class ClaimIndex:
    """Every ResourceClaim by uid (a newer resourceVersion wins), indexed by the uid of
    each owner and by (driver, pool) of each device allocated."""

    def __init__(self, claims: list[Obj] | None = None) -> None:
        self.claims: dict[str, Obj] = {}
        self._owned: dict[str, set[str]] = {}  # owner uid -> claim uids
        self._pooled: dict[tuple[str, str], set[str]] = {}  # (driver, pool) -> claim uids
        self.reset(claims or [])

    def reset(self, claims: list[Obj]) -> None:
        self.claims.clear()
        self._owned.clear()
        self._pooled.clear()
        for claim in claims:
            self.put(claim)

    def put(self, claim: Obj) -> None:
        uid = uid_of(claim)
        stored = self.claims.get(uid)
        if stored is not None:
            if version_of(stored) > version_of(claim):
                return
            self._unindex(stored)
        self.claims[uid] = claim
        for ref in claim["metadata"].get("ownerReferences") or []:
            self._owned.setdefault(str(ref.get("uid")), set()).add(uid)
        for key in claim_pool_keys(claim):
            self._pooled.setdefault(key, set()).add(uid)

    def drop(self, claim: Obj) -> None:
        stored = self.claims.pop(uid_of(claim), None)
        if stored is not None:
            self._unindex(stored)

    def _unindex(self, claim: Obj) -> None:
        uid = uid_of(claim)
        for ref in claim["metadata"].get("ownerReferences") or []:
            self._owned.get(str(ref.get("uid")), set()).discard(uid)
        for key in claim_pool_keys(claim):
            self._pooled.get(key, set()).discard(uid)

    def owned_by(self, pod: Obj) -> list[Obj]:
        uids = self._owned.get(pod["metadata"]["uid"], set())
        namespace = pod["metadata"]["namespace"]
        found = (self.claims[u] for u in sorted(uids) if u in self.claims)
        return [c for c in found if c["metadata"]["namespace"] == namespace]

    def in_pools(self, keys: set[tuple[str, str]]) -> set[str]:
        """Uids of the claims allocated a device of one of these pools."""
        return {uid for key in keys for uid in self._pooled.get(key, ())}


class ClaimInformer:
    """The claim informer part of :class:`DraSchedulerStandIn` (its state through
    ``self``)."""

    async def all_claims(self) -> list[Obj]:
        """Every ResourceClaim (per namespace of the pods when the server has no list across
        namespaces)."""
        try:
            return await self.items(f"{RESOURCE_API}/resourceclaims")
        except ApiStatus as exc:
            if exc.code not in (404, 405):
                raise
        pods = await self.items("/api/v1/pods")
        namespaces = sorted({p["metadata"]["namespace"] for p in pods})
        listed = await asyncio.gather(*(self.items(claims_path(ns)) for ns in namespaces))
        return [c for found in listed for c in found]

    # -- following claims ------------------------------------------------------------------

    async def follow_claims(self) -> None:
        """The claims' informer: every ResourceClaim listed, then watched from there (again
        from where it ended when a watch ends; listed again on 410 Expired)."""
        assert self.session is not None
        forever = aiohttp.ClientTimeout(total=None, sock_read=None)
        self._informing = True
        url = f"{self.api_url}{RESOURCE_API}/resourceclaims"
        while True:
            try:
                listing = await self.call("GET", f"{RESOURCE_API}/resourceclaims")
                self.index.reset(list(listing.get("items") or []))
                version = listing["metadata"]["resourceVersion"]
                self._indexed.set()
                while version:
                    watch = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "60"}
                    async with self.session.get(url, params=watch, timeout=forever) as response:
                        response.raise_for_status()
                        async for line in response.content:
                            version = self._claim_event(json.loads(line), version)
                            if not version:
                                break
            except (aiohttp.ClientError, ApiStatus, TimeoutError, ValueError):
                await asyncio.sleep(self.poll_s)

    def _claim_event(self, event: Obj, version: str) -> str:
        """Apply one watch event; the version to go on from ("": list again)."""
        if event["type"] == "ERROR":
            return ""
        claim = event["object"]
        if event["type"] == "DELETED":
            self.index.drop(claim)
        elif event["type"] in ("ADDED", "MODIFIED"):
            self.index.put(claim)
        return str(claim["metadata"].get("resourceVersion") or version)

    async def claim_index(self) -> ClaimIndex:
        """The informer's index; without one running (:meth:`schedule` called alone), one
        made now from a list of every claim."""
        if not self._informing:
            return ClaimIndex(await self.all_claims())
        await self._indexed.wait()
        return self.index

    def _learn(self, claim: Obj) -> Obj:
        """A claim as a write answered it: into the index (unless it knows a newer one)."""
        if self._informing:
            self.index.put(claim)
        return claim

    # -- following pods --------------------------------------------------------------------


@dataclass
class ClaimView:
    """An attempt's claims: the index's, the assumed ones in place of theirs."""

    index: ClaimIndex
    assumed: dict[str, Obj]  # claim uid -> as this stand-in allocated it

    def current(self, claim: Obj) -> Obj:
        uid = uid_of(claim)
        return self.assumed.get(uid) or self.index.claims.get(uid) or claim

    def in_pools(self, keys: set[tuple[str, str]], *, leaving_out: set[str]) -> list[Obj]:
        """The claims allocated a device of these pools (as assumed, where assumed)."""
        uids = self.index.in_pools(keys)
        uids |= {uid for uid, c in self.assumed.items() if claim_pool_keys(c) & keys}
        found = (self.assumed.get(uid) or self.index.claims.get(uid) for uid in sorted(uids))
        return [c for c in found if c is not None and uid_of(c) not in leaving_out]
