"""Binding answers (KEP-5007): the scheduler waits, before it binds a pod, until the
driver says each allocated device is usable. The agent follows the claims, and for each
share allocated to this node that waits for an answer it admits the share's lease (all of
the agent's rules: retention gate, trust domain, client cap, priorities) and writes
``gpushare.io/admitted`` (or ``gpushare.io/refused`` with the reason) into the claim's
``status.devices``. A refused share makes the scheduler deallocate the claim and try
again; the lease admitted here is the one Prepare finds. An answer not written stays owed
(:class:`agent.runtime.owed.Owed`): tried again, the claim read first, until it is
written or the claim no longer waits for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from agent.core.errors import GpushareError
from agent.core.lease import Lease
from agent.core.types import ReasonCode
from agent.core.units import format_bytes
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
from agent.kubeapi.port import Conflict, Gone, KubeError, NotFound, Obj, ResourceApi
from agent.runtime.claims import one_share_per_request
from agent.runtime.dra import ClaimDriver
from agent.runtime.owed import Debt, Outcome, Owed

log = logging.getLogger(__name__)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BindingAnswers:
    """The binding answers of this node's shares. An answer not written is owed, and
    tried again with a backoff doubling from ``backoff_s`` up to ``backoff_max_s``, each
    try reading the claim first, until the claim is answered (by a write of the answer,
    or one that landed with its answer lost), gone (deleted, replaced by another of its
    name), or no longer waiting (deallocated, allocated elsewhere). Every outcome of the
    status write is tried again: 409 and 404 at once (the claim read again), 5xx, 429 and
    no answer after a backoff, and any other 4xx too (RBAC or a webhook may be fixed):
    logged as an error, bounded in time by the scheduler, which deallocates a claim not
    bound within its binding timeout. A decision is made again at each try, on the
    claim as read: a refusal keeps no lease, an admission keeps its lease until the claim
    is gone or no longer allocated here.

    Cost: one task per claim owed, none for answered ones; the claims owed are those
    allocated to this node's devices and not yet bound, which the devices' published
    ``clients`` capacity bounds. A relist (at start, after the watch failed, or on 410
    Gone) considers every waiting claim again and wakes the task of one already owed
    rather than starting another. A watch that ends at its timeout is resumed from its
    resourceVersion without a relist: it misses nothing, and a relist reads every claim
    of the cluster."""

    def __init__(
        self,
        driver: ClaimDriver,
        api: ResourceApi,
        *,
        concurrency: int = 32,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        watch_timeout_s: float = 300.0,
    ) -> None:
        self._driver = driver
        self._api = api
        self._slots = asyncio.Semaphore(concurrency)
        self._backoff_s = backoff_s
        self._watch_timeout_s = watch_timeout_s
        # claim UID -> its owed answer, tried first on the watch's copy, then re-read
        self._owed: Owed[Obj] = Owed(
            self._attempt, first_s=backoff_s, max_s=backoff_max_s, name=_task_name
        )
        # a claim allocated here names this node (its pool, its node selector) in its JSON
        self._mentioning = json.dumps(driver.node_name)
        self.answered = 0  # shares whose answer was written (admitted or refused)
        self.refused = 0

    @property
    def owing(self) -> int:
        """Claims whose answer is owed now."""
        return len(self._owed)

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
            await self._owed.aclose()

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
                        self._owed.nudge(_uid(event.obj))
            except Gone:
                return  # list again

    def _consider(self, claim: Obj) -> None:
        """Owe the claim its answer if it waits for one; wake its owed try if any."""
        driver = self._driver
        try:
            waiting = pending_conditions(claim, driver.driver_name, driver.node_name)
        except ClaimError as exc:
            log.warning("claim %s cannot be read: %s", _key(claim), exc)
            return
        uid = _uid(claim)
        if waiting or uid in self._owed:
            self._owed.owe(uid, claim)

    async def _attempt(self, debt: Debt[Obj]) -> bool:
        """One try at the claim's answer, under its lock: on the watch's copy first (the
        newest seen), after that on the claim read again; True once nothing is owed."""
        async with self._driver.leases.claim_lock(_uid(debt.item)), self._slots:
            reread = debt.tries > 0
            for _ in range(2):  # a copy found stale is read again at once, once
                outcome = await self._try(debt.item, reread=reread)
                if outcome is not Outcome.STALE:
                    return outcome is Outcome.SETTLED
                reread = True
        return False

    async def _try(self, copy: Obj, *, reread: bool) -> Outcome:
        """Decide on the claim as the API has it now, never on an older copy: after a
        write whose outcome is unknown, read it again first (an answer that landed is not
        given twice, a refusal that landed keeps no lease)."""
        try:
            claim = await self._reread(copy) if reread else copy
            return await self._answer(claim) if claim else await self._gone(copy)
        except ClaimError as exc:  # cannot be read: its next event tries again
            log.warning("binding answer for claim %s not given: %s", _key(copy), exc)
            return Outcome.SETTLED
        except GpushareError as exc:  # not read again, the lease store: tried again
            log.warning("binding answer for claim %s not given now: %s", _key(copy), exc)
            return Outcome.FAILED

    async def _gone(self, claim: Obj) -> Outcome:
        """Deleted, or replaced by another of its name: its leases here are released."""
        await self._release(claim, "its claim is gone")
        return Outcome.SETTLED

    async def _answer(self, claim: Obj) -> Outcome:
        driver = self._driver
        waiting = pending_conditions(claim, driver.driver_name, driver.node_name)
        if not waiting:
            await self._settle(claim)
            return Outcome.SETTLED
        answers = await self._decide(claim, waiting)
        return await self._written(claim, answers)

    async def _settle(self, claim: Obj) -> None:
        """A claim that waits for no answer from this node keeps no lease here if this
        agent refused it (a refusal that landed with its answer lost, while a lease was
        admitted again) or if none of its shares is allocated here any more."""
        driver = self._driver
        if refused_here(claim, driver.driver_name, driver.node_name):
            await self._release(claim, "refused at its binding")
        elif not shares(claim, driver.driver_name, driver.node_name):
            await self._release(claim, "its claim is no longer allocated here")

    async def _release(self, claim: Obj, why: str) -> None:
        await self._driver.leases.release_claim(_uid(claim), why)

    async def _decide(self, claim: Obj, waiting: list[Share]) -> list[tuple[Share, Obj]]:
        """Admit each waiting share; if one is refused, the claim's shares admitted here
        are given back (a claim is all or nothing), every answer is a refusal and each
        refused share's device backs off."""
        answers, at = [], now_rfc3339()
        refusal = ""
        try:
            one_share_per_request(shares(claim, self._driver.driver_name, self._driver.node_name))
        except ClaimError as exc:
            refusal = str(exc)
        refused_on: list[str] = []  # devices whose ledger said no (they back off)
        for share in [] if refusal else waiting:
            if share.admin:  # adminAccess: the device to look at, no share to admit
                answers.append((share, condition(ADMITTED, "AdminAccess", ADMIN_MESSAGE, at)))
                continue
            try:
                lease = await self._driver.admit_share(claim, share)
            except (ClaimError, GpushareError) as exc:
                refusal = refusal or str(exc)
                if _reason(str(exc)) in DEVICE_REFUSALS:
                    refused_on.append(share.device)
                continue
            answers.append((share, condition(ADMITTED, "Admitted", admitted_message(lease), at)))
        if not refusal:
            return answers
        await self._release(claim, f"refused at its binding: {refusal}")
        reason = _reason(refusal)
        self._driver.note(
            "dra.refused", f"claim {_key(claim)} refused at its binding: {refusal}", claim,
            reason=reason,
        )  # fmt: skip
        for device in refused_on:
            self._driver.refused_device(device)
        return [(s, condition(REFUSED, reason, refusal, at)) for s in waiting]

    async def _written(self, claim: Obj, answers: list[tuple[Share, Obj]]) -> Outcome:
        try:
            await self._write(claim, answers)
        except (Conflict, NotFound):
            return Outcome.STALE  # changed or gone meanwhile: the answer may have landed
        except KubeError as exc:
            refused = 400 <= exc.status < 500 and exc.status != 429  # RBAC, validation
            log.log(
                logging.ERROR if refused else logging.WARNING,
                "binding answer for claim %s not written (%s); tried again",
                _key(claim),
                exc,
            )
            return Outcome.FAILED
        self.answered += len(answers)
        self.refused += sum(1 for _, c in answers if c["type"] == REFUSED)
        return Outcome.SETTLED

    async def _write(self, claim: Obj, answers: list[tuple[Share, Obj]]) -> None:
        driver = self._driver
        body = with_device_status(claim, driver.driver_name, driver.node_name, answers)
        meta = metadata(claim)
        await self._api.replace_resource_claim_status(
            str(meta.get("namespace") or ""), str(meta.get("name") or ""), body
        )

    async def _reread(self, claim: Obj) -> Obj:
        """The claim as the API has it now; {} when it is gone or replaced."""
        meta = metadata(claim)
        try:
            fresh = await self._api.get_resource_claim(
                str(meta.get("namespace") or ""), str(meta.get("name") or "")
            )
        except NotFound:
            return {}
        return fresh if metadata(fresh).get("uid") == meta.get("uid") else {}


ADMIN_MESSAGE = "adminAccess: the device without a share (no lease, no limits)"
# A refusal that says the device cannot take the share now: the device backs off. A claim
# refused for what it asks (its configuration, a request on two GPUs) does not.
DEVICE_REFUSALS = frozenset(
    code.value
    for code in (
        ReasonCode.NO_MEMORY,
        ReasonCode.NO_COMPUTE,
        ReasonCode.TRUST_CONFLICT,
        ReasonCode.RETENTION_BELOW_FLOOR,
        ReasonCode.DEVICE_DEGRADED,
        ReasonCode.DRAINING,
        ReasonCode.CLIENT_LIMIT,
        ReasonCode.EXCLUSIVE_BUSY,
        ReasonCode.DEVICE_UNAVAILABLE,
        ReasonCode.STORE_UNAVAILABLE,
    )
)


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


def _uid(claim: Mapping[str, Any]) -> str:
    return str(metadata(claim).get("uid") or "")


def _task_name(claim: Mapping[str, Any]) -> str:
    return f"binding-{_key(claim)}"
