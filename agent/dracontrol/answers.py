"""What a claim waits for, and what is written for it: the pools (= nodes) where a result of
the driver waits for its binding condition, the shares waiting there, and the condition
written for the agent's word. Pure functions of the claim's JSON."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from agent.dra.claims import (
    ADMITTED,
    REFUSED,
    ClaimError,
    allocation,
    condition,
    pending_conditions,
)
from agent.dracontrol.port import ShareAnswerValue
from agent.kubeapi.port import Obj

DRIVER = "gpushare.io"
# metav1.Condition's reason
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def waiting_pools(claim: Mapping[str, Any], driver: str = DRIVER) -> list[str]:
    """The pools (= nodes) where a result of ``driver`` waits for its binding condition,
    in the order of the claim's results."""
    found = allocation(claim) or {}
    results = (found.get("devices") or {}).get("results") or []
    pools = list(
        dict.fromkeys(str(r.get("pool") or "") for r in results if r.get("driver") == driver)
    )
    waiting = []
    for pool in pools:
        try:
            pending = bool(pending_conditions(claim, driver, pool))
        except ClaimError:  # a result the agent will refuse: waiting all the same
            pending = bool(raw_pending(claim, driver, pool))
        if pending:
            waiting.append(pool)
    return waiting


def raw_pending(claim: Mapping[str, Any], driver: str, pool: str) -> set[tuple[str, str]]:
    """(device, shareID) of the results in ``pool`` that carry binding conditions and have
    no answer yet, read without checking the results."""
    found = allocation(claim) or {}
    answered = {
        (str(d.get("device") or ""), str(d.get("shareID") or ""))
        for d in (claim.get("status") or {}).get("devices") or []
        if d.get("driver") == driver and d.get("pool") == pool and d.get("conditions")
    }
    return {
        (str(r.get("device") or ""), str(r.get("shareID") or ""))
        for r in (found.get("devices") or {}).get("results") or []
        if r.get("driver") == driver and r.get("pool") == pool and r.get("bindingConditions")
    } - answered


def answer_condition(answer: ShareAnswerValue, at: str) -> Obj:
    """The condition written for the agent's answer: its reason where it is a valid
    condition reason, else ``Admitted`` / ``Refused``; a message always."""
    kind, default = (ADMITTED, "Admitted") if answer.admitted else (REFUSED, "Refused")
    reason = answer.reason if _REASON.match(answer.reason) and len(answer.reason) <= 128 else ""
    message = answer.message or ("admitted by the node's agent" if answer.admitted else "refused")
    return condition(kind, reason or default, message, at)
