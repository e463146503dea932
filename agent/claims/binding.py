"""Binding answers (KEP-5007): the scheduler waits, before it binds a pod, until the driver
says each allocated device is usable. The cluster's one binding controller follows the
claims and asks this node's agent (``AnswerClaim``) about a claim allocated here; the agent
decides, by all of its rules (retention gate, trust domain, client cap, priorities), on
each of its shares here that waits for an answer, and the controller writes the answers
into the claim's ``status.devices``. The agent follows no claim itself: its cost is the
claims it is asked about.

A share is admitted by admitting its lease (the one Prepare finds: same request id), an
``adminAccess`` result with no lease; a claim is all or nothing: one refusal gives back
the claim's leases here and refuses every waiting share, and a device whose ledger said no
backs off (a taint for ``dra.refusal_backoff_s``). Asked again, the same claim gets the
same answer and the same leases.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from agent.aio.section import run_to_end
from agent.api.ports import ShareAnswer
from agent.claims.driver import ClaimDriver
from agent.claims.shares import ShareAsk, one_share_per_request
from agent.core.errors import ConflictError, GpushareError, StateError, ValidationError
from agent.core.lease import Lease
from agent.core.types import ReasonCode
from agent.core.units import format_bytes
from agent.dra.claims import ClaimError, Share, metadata, pending_conditions, shares

log = logging.getLogger(__name__)

ADMIN_MESSAGE = "adminAccess: the device without a share (no lease, no limits)"
# A refusal that says the device cannot take the share now: the device backs off. A claim
# refused for what it asks (its configuration, a request on two GPUs) does not.
DEVICE_REFUSALS = frozenset(
    code.value
    for code in (
        ReasonCode.NO_MEMORY,
        ReasonCode.NO_COMPUTE,
        ReasonCode.TRUST_CONFLICT,
        ReasonCode.USER_CONFLICT,
        ReasonCode.RETENTION_BELOW_FLOOR,
        ReasonCode.DEVICE_DEGRADED,
        ReasonCode.DRAINING,
        ReasonCode.CLIENT_LIMIT,
        ReasonCode.EXCLUSIVE_BUSY,
        ReasonCode.DEVICE_UNAVAILABLE,
        ReasonCode.STORE_UNAVAILABLE,
    )
)
FIELD = "claim_json"


async def decide(driver: ClaimDriver, claim: Mapping[str, Any]) -> list[ShareAnswer]:
    """The answers on the claim's shares here that wait for one ([] when none does), under
    the claim's lock; the work runs to its end even if the caller goes away (a lease
    admitted is then found by the next ask, or given back by the reconcile). A claim that
    cannot be read: ValidationError."""
    uid = str(metadata(claim).get("uid") or "")
    if not uid:
        raise ValidationError(f"{FIELD}.metadata.uid", "is required")

    async def locked() -> list[ShareAnswer]:
        async with driver.leases.claim_lock(uid):
            return await _decide(driver, claim, uid)

    return await run_to_end(locked(), what=f"the binding answer of claim {_key(claim)}")


async def _decide(driver: ClaimDriver, claim: Mapping[str, Any], uid: str) -> list[ShareAnswer]:
    waiting, mine = _read(driver, claim)
    if not waiting:
        return []
    refusal, asks = _asks_refused(driver, claim, waiting, mine)
    if not refusal:
        refusal, asks = await _with_user(driver, claim, asks)
    if not refusal:  # a claim refused for what it asks gets nothing kept on the node
        await _remember(driver, claim, uid)
    refused_on = ""  # the device whose ledger said no: it backs off
    answers: list[ShareAnswer] = []
    for share in [] if refusal else waiting:
        if share.admin:  # adminAccess: the device to look at, no share to admit
            answers.append(_answer(share, True, "AdminAccess", ADMIN_MESSAGE))
            continue
        try:
            lease = await driver.admit_ask(asks[share.key])
        except (ClaimError, GpushareError) as exc:
            refusal = str(exc)
            refused_on = share.device if reason_of(refusal) in DEVICE_REFUSALS else ""
            break  # the claim is refused: no more of its shares admitted
        answers.append(_answer(share, True, "Admitted", admitted_message(lease)))
    if not refusal:
        driver.binding_admitted += len(answers)
        return answers
    await driver.leases.release_claim(uid, f"refused at its binding: {refusal}")
    reason = reason_of(refusal)
    driver.note(
        "dra.refused", f"claim {_key(claim)} refused at its binding: {refusal}", claim,
        reason=reason,
    )  # fmt: skip
    if refused_on:
        driver.refused_device(refused_on)
    driver.binding_refused += len(waiting)
    return [_answer(s, False, reason, refusal) for s in waiting]


def _read(driver: ClaimDriver, claim: Mapping[str, Any]) -> tuple[list[Share], list[Share]]:
    """The shares here that wait for an answer, and every share here; a claim whose
    results cannot be read is not a claim to answer (ValidationError)."""
    try:
        waiting = pending_conditions(claim, driver.driver_name, driver.node_name)
        return waiting, shares(claim, driver.driver_name, driver.node_name)
    except ClaimError as exc:
        raise ValidationError(FIELD, f"cannot be read as a claim: {exc}") from None
    except (AttributeError, TypeError, ValueError) as exc:  # a part of the wrong JSON type
        raise ValidationError(
            FIELD, f"is not a ResourceClaim (its status is malformed: {type(exc).__name__})"
        ) from None


async def _remember(driver: ClaimDriver, claim: Mapping[str, Any], uid: str) -> None:
    """The claim's name kept on the node before anything of it is admitted (the reconcile
    reads the claim of a lease by its name); not kept: nothing is decided."""
    meta = metadata(claim)
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    try:
        driver.remember_claim(uid, namespace, name)  # a small write: no thread hop
    except ValueError as exc:
        raise ValidationError(f"{FIELD}.metadata", f"cannot be kept on the node: {exc}") from None
    except OSError as exc:
        raise StateError(
            f"the name of claim {_key(claim)} cannot be kept on the node: {exc}"
        ) from exc


def _asks_refused(
    driver: ClaimDriver, claim: Mapping[str, Any], waiting: list[Share], mine: list[Share]
) -> tuple[str, dict[str, ShareAsk]]:
    """What the claim asks, checked before anything is admitted: one share per request,
    each waiting share's device published here and its configuration; the refusal (or
    ""), and the waiting shares' asks by share key."""
    try:
        one_share_per_request(mine)
        asks = {s.key: driver.ask(claim, s) for s in waiting if not s.admin}
    except ClaimError as exc:
        return str(exc), {}
    except (AttributeError, TypeError, ValueError) as exc:  # its config of the wrong type
        raise ValidationError(
            FIELD, f"is not a ResourceClaim (its configuration is malformed: {type(exc).__name__})"
        ) from None
    return "", asks


async def _with_user(
    driver: ClaimDriver, claim: Mapping[str, Any], asks: dict[str, ShareAsk]
) -> tuple[str, dict[str, ShareAsk]]:
    """The asks with the user of the claim's pods (read only when a share is to be
    admitted); a claim that cannot say one where it must, is used by two, or gives one
    container two shares is refused for what it asks: no device backs off."""
    uid = str(metadata(claim).get("uid") or "")
    if all(driver.leases.live(uid, a.share) is not None for a in asks.values()):
        return "", asks  # asked again: its leases stand as they are, read no pod
    try:
        told = await driver.with_user(claim, list(asks.values()))
    except ClaimError as exc:
        return str(exc), {}
    return "", {a.share.key: a for a in told}


def _answer(share: Share, admitted: bool, reason: str, message: str) -> ShareAnswer:
    return ShareAnswer(share.device, share.share_id, admitted, reason, message[:1024])


def admitted_message(lease: Lease) -> str:
    return (
        f"lease {lease.lease_id} on {lease.device_uuid}: {format_bytes(lease.memory_bytes)}, "
        f"{lease.thread_pct:g}% threads"
    )


def reason_of(refusal: str) -> str:
    """The condition's reason: the agent's reason code (``NO_MEMORY: ...``), else Refused."""
    code = refusal.partition(":")[0]
    return code if code.isupper() and code.replace("_", "").isalpha() else "Refused"


def _key(claim: Mapping[str, Any]) -> str:
    meta = metadata(claim)
    return f"{meta.get('namespace')}/{meta.get('name')}"


class BindingDecisions:
    """The API's :class:`agent.api.ports.ClaimAnswers`: the DRA driver's decision, once the
    driver is started."""

    def __init__(self, driver: Callable[[], ClaimDriver | None], *, enabled: bool) -> None:
        self._driver = driver
        self._enabled = enabled

    async def answer_claim(self, claim: Mapping[str, Any]) -> list[ShareAnswer]:
        if not self._enabled:
            raise ConflictError("the DRA driver is off on this node (dra.enabled is false)")
        driver = self._driver()
        if driver is None:
            raise GpushareError("the DRA driver is still starting")
        answers = await decide(driver, claim)
        for a in answers:
            log.info(
                "binding answer for claim %s: %s %s on %s",
                _key(claim),
                "admitted" if a.admitted else "refused",
                a.reason,
                a.device,
            )
        return answers
