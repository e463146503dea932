"""Each node's GPU-sharing state as Kubernetes shows it, for ``kubectl`` and the cluster
autoscaler: a label ``gpushare.io/ready`` ("true" or "false") and a node condition
``GpushareReady`` whose message gives each device's free memory and threads.

The cluster side writes them, not the agent: the agent has no Kubernetes credentials, and
an agent that is down cannot say so itself. The state comes from the agents' cache
(:class:`AgentCache`), which asks each agent at least every few seconds and marks one that
stops answering (an event stream that keeps reconnecting would not tell).
Free memory is counted as the extender counts it (the admission rules' own maths on the
same views), so the condition says what a new pod could get."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent.admission.policy import DeviceView, Rules, memory_left_bytes
from agent.api.proto import agent_pb2 as pb
from agent.core.units import format_bytes
from agent.kubeapi.port import KubeApi, KubeError, NotFound
from agent.legacy.cluster.cache import AgentCache, NodeEntry
from agent.legacy.cluster.views import device_views

log = logging.getLogger(__name__)

READY_LABEL = "gpushare.io/ready"
CONDITION = "GpushareReady"
REASON_READY = "AgentReady"  # it answers and at least one device takes new leases
REASON_NOT_READY = "AgentNotReady"  # it answers, but no device takes new leases
REASON_UNREACHABLE = "AgentUnreachable"  # it does not answer, or is no longer listed
MESSAGE_MAX_CHARS = 4096  # a node object stays small however many MIG instances it has
CHECK_S = 1.0  # how often the cache is looked at between heartbeats
PARALLEL_WRITES = 16  # nodes written at once
NOT_LISTED = "it is no longer listed among the agents' endpoints (stopped or not ready)"

Labels = dict[str, str]
Condition = dict[str, Any]


# -- the pure part ---------------------------------------------------------------------------


def free_text(views: Sequence[DeviceView], rules: Rules) -> str:
    """``GPU-87bb7b7c: 58.5 GiB, 175% threads free; ...``: what one more lease could get
    on each device; a closed device with its reason."""
    parts = []
    for view in views:
        name = view.device.uuid[:12]
        if view.closed is not None:
            parts.append(f"{name}: closed ({view.closed_detail or view.closed.value})")
            continue
        memory_bytes = max(memory_left_bytes(view, rules, extra_clients=1), 0)
        threads_pct = max(round(rules.thread_budget_pct - view.threads_committed_pct, 1), 0.0)
        parts.append(f"{name}: {format_bytes(memory_bytes)}, {threads_pct:g}% threads free")
    return "; ".join(parts) or "no devices"


def node_state(
    node_name: str,
    snapshot: pb.GetNodeResponse | None,
    error: str,
    rules: Rules,
    *,
    now: datetime,
    previous: Mapping[str, Any] | None = None,
) -> tuple[Labels, Condition]:
    """The label and the condition of ``node_name`` for its agent's last answer
    (``snapshot``; None when the agent does not answer, ``error`` says why).
    ``previous``: the condition published before; its ``lastTransitionTime`` is kept
    while the status stays the same."""
    if snapshot is None:
        ready, reason = False, REASON_UNREACHABLE
        message = f"the gpushare agent on {node_name} does not answer: {error or 'not connected'}"
    else:
        views = device_views(snapshot)
        ready = any(v.closed is None for v in views)
        reason = REASON_READY if ready else REASON_NOT_READY
        if ready:
            message = free_text(views, rules)
        elif views:
            message = f"every device is closed to new leases: {free_text(views, rules)}"
        else:
            message = "the gpushare agent reports no devices"
    if len(message) > MESSAGE_MAX_CHARS:
        message = message[: MESSAGE_MAX_CHARS - 3] + "..."
    status = "True" if ready else "False"
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    since = stamp
    if previous is not None and previous.get("status") == status:
        since = previous.get("lastTransitionTime") or stamp
    condition: Condition = {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": since,
    }
    return {READY_LABEL: "true" if ready else "false"}, condition


# -- publishing ------------------------------------------------------------------------------


async def publish_node_states(
    api: KubeApi,
    cache: AgentCache,
    rules: Rules,
    *,
    interval_s: float,
    check_s: float = CHECK_S,
) -> None:
    """Patch the label and the condition of every node the cache follows, every
    ``interval_s`` (the heartbeat), and within ``check_s`` of a change of status the cache
    shows (ready, not ready, unreachable: the cache asks each agent at least every
    ``HEARTBEAT_S`` and marks one that does not answer). A change of
    free memory alone waits for the next heartbeat: it changes with every lease. A node
    the cache stops following is written once more as unreachable, then forgotten; one it
    has not reached yet is left as it is for ``interval_s``. Runs until cancelled; API
    errors are logged and retried."""
    publisher = _Publisher(api, cache, rules, interval_s)
    while True:
        await publisher.round()
        await asyncio.sleep(min(interval_s, check_s))


@dataclass
class _Published:
    """What was last published for one node, and what its agent last answered."""

    labels: Labels | None = None
    condition: Condition | None = None
    written_at: float = float("-inf")  # monotonic; the next heartbeat is due interval_s on
    followed_at: float = field(default_factory=time.monotonic)
    missing: bool = False  # the node is 404 (logged once)


class _Publisher:
    def __init__(self, api: KubeApi, cache: AgentCache, rules: Rules, interval_s: float):
        self._api = api
        self._cache = cache
        self._rules = rules
        self._interval_s = interval_s
        self._nodes: dict[str, _Published] = {}
        self._writes = asyncio.Semaphore(PARALLEL_WRITES)

    async def round(self) -> None:
        followed = dict(self._cache.nodes)
        gone = [name for name in self._nodes if name not in followed]
        await asyncio.gather(
            *(self._node(entry) for entry in followed.values()),
            *(self._farewell(name) for name in gone),
        )

    async def _node(self, entry: NodeEntry) -> None:
        name = entry.node_name
        published = self._nodes.setdefault(name, _Published())
        started = time.monotonic()
        if not entry.ready.is_set() and started - published.followed_at < self._interval_s:
            return  # not connected yet: a restart of this side must not flap every node
        due = started - published.written_at >= self._interval_s
        try:
            snapshot, error = _newest(entry)
            labels, condition = node_state(
                name, snapshot, error, self._rules, now=_now(), previous=published.condition
            )
            if not due and (published.missing or _same_status(published, labels, condition)):
                return
            await self._write(name, published, labels, condition, started)
        except Exception:  # the node's state is advisory: one node never stops the rest
            log.exception("cannot publish the gpushare state of node %s", name)
            published.written_at = started

    async def _farewell(self, name: str) -> None:
        published = self._nodes.pop(name)
        if published.condition is None or published.missing:
            return
        labels, condition = node_state(
            name, None, NOT_LISTED, self._rules, now=_now(), previous=published.condition
        )
        try:
            await self._write(name, published, labels, condition, time.monotonic())
        except Exception:
            log.exception("cannot publish the gpushare state of node %s", name)

    async def _write(
        self,
        name: str,
        published: _Published,
        labels: Labels,
        condition: Condition,
        started: float,
    ) -> None:
        published.written_at = started  # a failed write is tried again at the heartbeat
        async with self._writes:
            try:
                await self._api.patch_node_status(name, {"status": {"conditions": [condition]}})
                published.condition = condition
                if labels != published.labels:
                    await self._api.patch_node(name, {"metadata": {"labels": labels}})
                    published.labels = labels
            except NotFound:
                if not published.missing:
                    log.info("node %s does not exist: its gpushare state is not published", name)
                published.missing = True
                published.labels = published.condition = None
                return
            except KubeError as exc:
                log.warning("cannot publish the gpushare state of node %s: %s", name, exc)
                return
        if published.missing:
            log.info("node %s exists again: its gpushare state is published", name)
        published.missing = False


def _newest(entry: NodeEntry) -> tuple[pb.GetNodeResponse | None, str]:
    """The agent's last answer, or None and why while the cache has no live one."""
    if entry.link is None or entry.stale or entry.snapshot is None:
        return None, entry.error or "not connected"
    return entry.snapshot, ""


def _same_status(published: _Published, labels: Labels, condition: Condition) -> bool:
    """Nothing changed but free memory and the heartbeat since the last write."""
    last = published.condition
    return (
        last is not None
        and labels == published.labels
        and (last["status"], last["reason"]) == (condition["status"], condition["reason"])
    )


def _now() -> datetime:
    return datetime.now(UTC)
