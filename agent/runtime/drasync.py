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
import json
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
    ADMITTED,
    REFUSED,
    ClaimError,
    Share,
    condition,
    metadata,
    pending_conditions,
    refused_here,
    shares,
    with_device_status,
)
from agent.kubeapi.port import Conflict, Gone, KubeError, NotFound, Obj, ResourceApi, Unanswered
from agent.runtime.claims import claim_uid_of, one_share_per_node, share_of
from agent.runtime.dra import ClaimDriver

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
        # a claim allocated here names this node (its pool, its node selector) in its JSON
        self._mentioning = json.dumps(driver.node_name)
        # claim UID -> the resourceVersion of the newest copy the watch showed of a claim
        # waiting for an answer: a task holding that copy decides on it without a read
        self._newest: dict[str, str] = {}
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
                    version, timeout_s=self._watch_timeout_s, mentioning=self._mentioning
                ):
                    version = str(metadata(event.obj).get("resourceVersion") or version)
                    if event.kind in ("ADDED", "MODIFIED"):
                        self._consider(event.obj)
                    elif event.kind == "DELETED":
                        self._newest.pop(str(metadata(event.obj).get("uid") or ""), None)
            except Gone:
                return  # list again

    def _consider(self, claim: Obj) -> None:
        driver = self._driver
        try:
            waiting = pending_conditions(claim, driver.driver_name, driver.node_name)
        except ClaimError as exc:
            log.warning("claim %s cannot be read: %s", _key(claim), exc)
            return
        uid = str(metadata(claim).get("uid") or "")
        if not waiting:
            self._newest.pop(uid, None)
            return
        self._newest[uid] = str(metadata(claim).get("resourceVersion") or "")
        task = asyncio.create_task(self._answer(claim), name=f"binding-{_key(claim)}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, claim: Obj) -> None:
        uid = str(metadata(claim).get("uid") or "")
        # the claim's lock first: events of one claim waiting for it hold no slot
        async with self._driver.leases.claim_lock(uid), self._slots:
            try:
                await self._answer_locked(claim)
            except (ClaimError, GpushareError) as exc:  # its next event tries again
                log.warning("binding answer for claim %s not given: %s", _key(claim), exc)
            except Exception:
                log.exception("binding answer for claim %s failed", _key(claim))

    async def _answer_locked(self, event_claim: Obj) -> None:
        """Decide on the claim as the API has it now, never on an older copy: after a
        write whose outcome is unknown, read it again first (an answer that landed is not
        given twice, a refusal that landed keeps no lease)."""
        driver = self._driver
        for attempt in range(STATUS_TRIES):
            if attempt:
                await asyncio.sleep(self._backoff_s)
            if not attempt and self._is_newest(event_claim):
                claim = event_claim  # nothing newer seen: the watch's copy is current
            else:
                try:
                    claim = await self._reread(event_claim)
                except KubeError as exc:
                    log.warning("claim %s not read again: %s", _key(event_claim), exc)
                    continue
            if not claim:
                return  # gone, or replaced by another of its name
            waiting = pending_conditions(claim, driver.driver_name, driver.node_name)
            if not waiting:
                await self._settle_refused(claim)
                return
            answers = await self._decide(claim, waiting)
            try:
                await self._write(claim, answers)
                return
            except (Conflict, Unanswered):
                continue  # read again: the answer may have landed
            except NotFound:
                return
            except KubeError as exc:  # refused: RBAC, validation; logged, tried again
                log.error("binding answer for claim %s refused: %s", _key(claim), exc)
        log.error(
            "binding answer for claim %s not written after %d tries",
            _key(event_claim),
            STATUS_TRIES,
        )

    def _is_newest(self, claim: Obj) -> bool:
        meta = metadata(claim)
        version = str(meta.get("resourceVersion") or "")
        return bool(version) and self._newest.get(str(meta.get("uid") or "")) == version

    async def _settle_refused(self, claim: Obj) -> None:
        """A claim this agent refused keeps no lease (a refusal whose write landed with
        its answer lost, while a lease was admitted again)."""
        driver = self._driver
        if refused_here(claim, driver.driver_name, driver.node_name):
            uid = str(metadata(claim).get("uid") or "")
            await driver.leases.release_claim(uid, "refused at its binding")

    async def _decide(self, claim: Obj, waiting: list[Share]) -> list[tuple[Share, Obj]]:
        """Admit each waiting share; if one is refused, the claim's shares admitted here
        are given back (a claim is all or nothing) and every answer is a refusal."""
        answers, at = [], now_rfc3339()
        refusal = ""
        try:
            one_share_per_node(shares(claim, self._driver.driver_name, self._driver.node_name))
        except ClaimError as exc:
            refusal = str(exc)
        for share in [] if refusal else waiting:
            try:
                lease = await self._driver.admit_share(claim, share)
            except (ClaimError, GpushareError) as exc:
                refusal = refusal or str(exc)
                continue
            answers.append((share, condition(ADMITTED, "Admitted", admitted_message(lease), at)))
        if not refusal:
            self.answered += len(answers)
            return answers
        uid = str(metadata(claim).get("uid") or "")
        await self._driver.leases.release_claim(uid, f"refused at its binding: {refusal}")
        reason = _reason(refusal)
        self._driver.note(
            "dra.refused", f"claim {_key(claim)} refused at its binding: {refusal}", claim,
            reason=reason,
        )  # fmt: skip
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


def admitted_message(lease: Lease) -> str:
    return (
        f"lease {lease.lease_id} on {lease.device_uuid}: {format_bytes(lease.memory_bytes)}, "
        f"{lease.thread_pct:g}% threads"
    )


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
            except (GpushareError, OSError) as exc:  # the next pass tries again
                log.warning("claim reconcile failed: %s", exc)
            except Exception:
                log.exception("claim reconcile failed")

    async def once(self) -> None:
        """Release the shares no claim allocates to this node any more: each by its
        claim and share (a claim allocated here again holds new shares), only leases
        older than the listing, each checked again under its claim's lock."""
        started = self._clock()
        listing = await self._api.list_resource_claims()
        allocated, unreadable = self._allocated_here(listing.items)
        stale: dict[str, list[str]] = {}
        for lease in self._driver.live_leases():
            uid = claim_uid_of(lease.request_id)
            if not uid or not lease.held_by_claim or uid in unreadable:
                continue
            if (uid, share_of(lease.request_id)) not in allocated and lease.updated_at < started:
                stale.setdefault(uid, []).append(lease.lease_id)
        for uid, lease_ids in sorted(stale.items()):
            await self._release(uid, lease_ids, started)
        await self._remove_orphan_specs({uid for uid, _ in allocated} | unreadable)
        self.passes += 1

    async def _release(self, uid: str, lease_ids: list[str], started: float) -> None:
        leases = self._driver.leases
        async with leases.claim_lock(uid):
            still = [
                x.lease_id
                for x in self._driver.live_leases()
                if x.lease_id in lease_ids and x.updated_at < started
            ]
            released = await leases.release(still, uid, "its claim is gone from this node")
            if not any(claim_uid_of(x.request_id) == uid for x in self._driver.live_leases()):
                await asyncio.to_thread(remove_spec, self._cdi_dir, uid)
        self.released += len(released)
        if released:
            self._driver.note(
                "dra.claim_gone",
                f"claim {uid}: shares no longer allocated here; released {', '.join(released)}",
                {"metadata": {"uid": uid}},
            )

    def _allocated_here(self, claims: list[Obj]) -> tuple[set[tuple[str, str]], set[str]]:
        """(claim UID, share key) of every share allocated to this node, and the UIDs of
        claims that cannot be read (their leases are left alone)."""
        driver = self._driver
        allocated: set[tuple[str, str]] = set()
        unreadable: set[str] = set()
        for claim in claims:
            uid = str(metadata(claim).get("uid") or "")
            try:
                mine = shares(claim, driver.driver_name, driver.node_name)
            except ClaimError:
                unreadable.add(uid)
                continue
            allocated.update((uid, share.key) for share in mine)
        return allocated, unreadable

    async def _remove_orphan_specs(self, kept: set[str]) -> None:
        live = {claim_uid_of(x.request_id) for x in self._driver.live_leases()}
        for uid in await asyncio.to_thread(spec_claims, self._cdi_dir):
            if uid not in kept and uid not in live:
                await asyncio.to_thread(remove_spec, self._cdi_dir, uid)
