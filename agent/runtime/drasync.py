"""The driver's two loops over the API's ResourceClaims.

* **Binding answers** (KEP-5007): the scheduler waits, before it binds a pod, until the
  driver says each allocated device is usable. The agent follows the claims, and for each
  share allocated to this node that waits for an answer it admits the share's lease (all
  of the agent's rules: retention gate, trust domain, client cap, priorities) and writes
  ``gpushare.io/admitted`` (or ``gpushare.io/refused`` with the reason) into the claim's
  ``status.devices``. A refused share makes the scheduler deallocate the claim and try
  again; the lease admitted here is the one Prepare finds.
* **Reconcile**: a lease of a claim that no longer exists, or is no longer allocated to
  this node, is released and its CDI spec removed (a pod force-deleted, a claim
  deallocated after its binding answer, an Unprepare that never came). Leases granted
  after the listing began are left for the next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from agent.core.errors import GpushareError
from agent.core.lease import Lease
from agent.core.units import format_bytes
from agent.dra.cdi import remove_spec, spec_claims
from agent.dra.claims import (
    ClaimError,
    Share,
    condition,
    metadata,
    pending_conditions,
    shares,
    with_device_status,
)
from agent.kubeapi.port import Conflict, Gone, KubeError, NotFound, Obj, ResourceApi
from agent.runtime.claims import claim_uid_of
from agent.runtime.dra import ClaimDriver
from agent.runtime.drainventory import ADMITTED, REFUSED

log = logging.getLogger(__name__)

STATUS_TRIES = 5


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BindingAnswers:
    def __init__(
        self,
        driver: ClaimDriver,
        api: ResourceApi,
        *,
        concurrency: int = 32,
        backoff_s: float = 1.0,
        watch_timeout_s: float = 300.0,
    ) -> None:
        self._driver = driver
        self._api = api
        self._slots = asyncio.Semaphore(concurrency)
        self._backoff_s = backoff_s
        self._watch_timeout_s = watch_timeout_s
        self._tasks: set[asyncio.Task[None]] = set()
        self.answered = 0  # shares answered (admitted or refused)
        self.refused = 0

    async def run(self) -> None:
        """Follow the claims until cancelled (list, then watch from there)."""
        try:
            while True:
                try:
                    await self._follow()
                except (KubeError, OSError) as exc:
                    log.warning(
                        "following ResourceClaims failed (%s); again in %.1fs", exc, self._backoff_s
                    )
                    await asyncio.sleep(self._backoff_s)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow(self) -> None:
        listing = await self._api.list_resource_claims()
        for claim in listing.items:
            self._consider(claim)
        version = listing.resource_version
        while True:
            try:
                async for event in self._api.watch_resource_claims(
                    version, timeout_s=self._watch_timeout_s
                ):
                    version = str(metadata(event.obj).get("resourceVersion") or version)
                    if event.kind in ("ADDED", "MODIFIED"):
                        self._consider(event.obj)
            except Gone:
                return  # list again

    def _consider(self, claim: Obj) -> None:
        driver = self._driver
        try:
            waiting = pending_conditions(claim, driver.driver_name, driver.node_name)
        except ClaimError as exc:
            log.warning("claim %s cannot be read: %s", _key(claim), exc)
            return
        if waiting:
            task = asyncio.create_task(self._answer(claim), name=f"binding-{_key(claim)}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, claim: Obj) -> None:
        uid = str(metadata(claim).get("uid") or "")
        async with self._slots, self._driver.leases.claim_lock(uid):
            try:
                await self._answer_locked(claim)
            except (ClaimError, GpushareError) as exc:  # the claim's next event tries again
                log.warning("binding answer for claim %s not given: %s", _key(claim), exc)
            except Exception:
                log.exception("binding answer for claim %s failed", _key(claim))

    async def _answer_locked(self, claim: Obj) -> None:
        # the claim as it is now: an answer written meanwhile (by this agent, for an
        # earlier event of the same claim) is not given again
        with contextlib.suppress(KubeError):  # unread: the event's copy will do
            claim = await self._reread(claim)
        for _ in range(STATUS_TRIES):
            waiting = pending_conditions(claim, self._driver.driver_name, self._driver.node_name)
            if not waiting:
                return
            answers = await self._decide(claim, waiting)
            try:
                await self._write(claim, answers)
                return
            except Conflict:
                claim = await self._reread(claim)
            except NotFound:
                return
            except KubeError as exc:
                log.warning("binding answer for claim %s not written: %s", _key(claim), exc)
                await asyncio.sleep(self._backoff_s)

    async def _decide(self, claim: Obj, waiting: list[Share]) -> list[tuple[Share, Obj]]:
        """Admit each waiting share; if one is refused, the claim's shares admitted here
        are given back (a claim is all or nothing) and every answer is a refusal."""
        answers, at = [], now_rfc3339()
        refusal = ""
        for share in waiting:
            try:
                lease = await self._driver.admit_share(claim, share)
            except ClaimError as exc:
                refusal = refusal or str(exc)
                continue
            message = (
                f"lease {lease.lease_id} on {share.device}: {format_bytes(lease.memory_bytes)}, "
                f"{lease.thread_pct:g}% threads"
            )
            answers.append((share, condition(ADMITTED, "Admitted", message, at)))
        if not refusal:
            self.answered += len(answers)
            return answers
        uid = str(metadata(claim).get("uid") or "")
        await self._driver.leases.release_claim(uid, f"refused at its binding: {refusal}")
        reason = _reason(refusal)
        self._driver.note(
            "dra.refused",
            f"claim {_key(claim)} refused at its binding: {refusal}",
            claim,
            reason=reason,
        )
        self.answered += len(waiting)
        self.refused += len(waiting)
        return [(s, condition(REFUSED, reason, refusal, at)) for s in waiting]

    async def _write(self, claim: Obj, answers: list[tuple[Share, Obj]]) -> None:
        driver = self._driver
        body = with_device_status(claim, driver.driver_name, driver.node_name, answers)
        meta = metadata(claim)
        await self._api.replace_resource_claim_status(
            str(meta.get("namespace") or ""), str(meta.get("name") or ""), body
        )

    async def _reread(self, claim: Obj) -> Obj:
        meta = metadata(claim)
        try:
            fresh = await self._api.get_resource_claim(
                str(meta.get("namespace") or ""), str(meta.get("name") or "")
            )
        except NotFound:
            return {}
        return fresh if metadata(fresh).get("uid") == meta.get("uid") else {}


def _reason(refusal: str) -> str:
    """The condition's reason: the agent's reason code (``NO_MEMORY: ...``), else Refused."""
    code = refusal.partition(":")[0]
    return code if code.isupper() and code.replace("_", "").isalpha() else "Refused"


def _key(claim: Mapping[str, Any]) -> str:
    meta = metadata(claim)
    return f"{meta.get('namespace')}/{meta.get('name')}"


class Reconciler:
    def __init__(
        self,
        driver: ClaimDriver,
        api: ResourceApi,
        *,
        cdi_dir: str,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._driver = driver
        self._api = api
        self._cdi_dir = cdi_dir
        self._interval_s = interval_s
        self._clock = clock
        self.released = 0
        self.passes = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.once()
            except (KubeError, OSError) as exc:
                log.warning("claim reconcile failed: %s", exc)

    async def once(self) -> None:
        started = self._clock()
        listing = await self._api.list_resource_claims()
        here = self._allocated_here(listing.items)
        leases = self._driver.leases
        stale = {
            uid
            for lease in list(self._driver_leases())
            if (uid := claim_uid_of(lease.request_id))
            and uid not in here
            and lease.updated_at < started
        }
        for uid in sorted(stale):
            async with leases.claim_lock(uid):
                released = await leases.release_claim(uid, "its claim is gone from this node")
                await asyncio.to_thread(remove_spec, self._cdi_dir, uid)
            self.released += len(released)
            self._driver.note(
                "dra.claim_gone",
                f"claim {uid} is gone or no longer allocated here: released "
                f"{', '.join(released) or 'nothing'}",
                {"metadata": {"uid": uid}},
                uid=uid,
            )
        await self._remove_orphan_specs(here)
        self.passes += 1
        if stale:
            self._driver.refresh()

    def _driver_leases(self) -> list[Lease]:
        return self._driver.live_leases()

    def _allocated_here(self, claims: list[Obj]) -> set[str]:
        driver, here = self._driver, set()
        for claim in claims:
            try:
                mine = shares(claim, driver.driver_name, driver.node_name)
            except ClaimError:
                mine = [Share("", "", "", None, None)]  # unreadable: never released for that
            if mine:
                here.add(str(metadata(claim).get("uid") or ""))
        return here

    async def _remove_orphan_specs(self, here: set[str]) -> None:
        live = {claim_uid_of(x.request_id) for x in self._driver_leases()}
        for uid in await asyncio.to_thread(spec_claims, self._cdi_dir):
            if uid not in here and uid not in live:
                await asyncio.to_thread(remove_spec, self._cdi_dir, uid)
