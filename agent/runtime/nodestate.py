"""What the agent tells Kubernetes about its node, for ``kubectl`` and the cluster
autoscaler: a label ``gpushare.io/ready`` ("true" or "false") and a node condition
``GpushareReady`` whose message gives each device's free memory and threads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from agent.admission.policy import Rules
from agent.core.types import DeviceLedger, NodeSnapshot
from agent.core.units import format_bytes

log = logging.getLogger(__name__)

READY_LABEL = "gpushare.io/ready"
CONDITION = "GpushareReady"

# (labels, condition) -> patched on the node
Publish = Callable[[dict[str, str], dict[str, Any]], Awaitable[None]]


def free_text(snapshot: NodeSnapshot, rules: Rules) -> str:
    """``GPU-87bb7b7c: 58.5 GiB, 175% threads free; ...`` for each device open to leases."""
    ledger = {x.device_uuid: x for x in snapshot.ledger}
    parts = []
    for device in snapshot.devices:
        entry = ledger.get(device.uuid) or DeviceLedger(device.uuid, 0, 0.0, 0)
        if entry.closed:
            parts.append(f"{device.uuid[:12]}: closed ({entry.closed_detail})")
            continue
        overhead = (entry.leases + 1) * rules.context_overhead_bytes
        memory = device.memory_bytes - rules.reserve_bytes - entry.memory_committed_bytes - overhead
        threads = rules.thread_budget_pct - entry.threads_committed_pct
        parts.append(
            f"{device.uuid[:12]}: {format_bytes(max(memory, 0))}, {threads:g}% threads free"
        )
    return "; ".join(parts) or "no devices"


def node_state(
    snapshot: NodeSnapshot, problems: Sequence[str], rules: Rules, *, now: datetime
) -> tuple[dict[str, str], dict[str, Any]]:
    """The label and the condition for this snapshot (``problems``: the agent's readiness
    problems, empty when ready)."""
    ready = not problems and any(not x.closed for x in snapshot.ledger)
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    why = "; ".join(problems) if problems else "every device is closed to new leases"
    condition = {
        "type": CONDITION,
        "status": "True" if ready else "False",
        "reason": "AgentReady" if ready else "AgentNotReady",
        "message": free_text(snapshot, rules) if ready else f"{why}. {free_text(snapshot, rules)}",
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
    return {READY_LABEL: "true" if ready else "false"}, condition


async def publish_forever(
    take: Callable[[], tuple[NodeSnapshot, list[str]]],
    publish: Publish,
    rules: Rules,
    *,
    interval_s: float,
) -> None:
    """Publish now and every ``interval_s``; a failed publication is logged and retried.
    ``lastTransitionTime`` moves only when the status changes."""
    last: tuple[str, str] = ("", "")
    while True:
        snapshot, problems = take()
        labels, condition = node_state(snapshot, problems, rules, now=datetime.now(UTC))
        if condition["status"] == last[0]:
            condition["lastTransitionTime"] = last[1]
        last = (condition["status"], condition["lastTransitionTime"])
        try:
            await publish(labels, condition)
        except Exception as exc:  # the node's state is advisory: never stop the agent
            log.warning("cannot publish the node's state: %s", exc)
        await asyncio.sleep(interval_s)
