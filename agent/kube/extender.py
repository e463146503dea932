"""The kube-scheduler extender (``managedResources: gpushare.io/share``,
``nodeCacheCapable: true``): filter, prioritize and bind over HTTP, in kube-scheduler's
JSON types (``k8s.io/kube-scheduler/extender/v1``).

Filter and prioritize run the agents' own admission rules on the cached state of each
node, so a node filtered out carries the same sentence ``gpushare explain`` would print
there; bind asks the node's agent, which has the last word.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from agent.admission.capacity import pending_lease
from agent.admission.policy import DeviceView, Rules, decide, memory_left_bytes
from agent.core.lease import LeaseState
from agent.core.types import AdmissionRequest, Decision
from agent.kube.annotations import AnnotationError, PodAsk, parse_ask
from agent.kube.binder import Binder
from agent.kube.cache import ASSUMED_S, AgentCache

log = logging.getLogger(__name__)

MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority
MEMO_S = 1.0  # a decision is reused while the node's views are the same, this long at most
MEMO_SIZE = 4096


def admission_of(pod: Mapping[str, Any], ask: PodAsk) -> AdmissionRequest:
    meta = pod.get("metadata") or {}
    return AdmissionRequest(
        request_id=meta.get("uid") or "filter",
        tenant=ask.tenant,
        trust_domain=ask.trust_domain,
        priority=ask.priority,
        memory_bytes=ask.memory_bytes,
        thread_pct=ask.thread_pct,
    )


class Extender:
    def __init__(self, cache: AgentCache, binder: Binder, rules: Rules) -> None:
        self.cache = cache
        self.binder = binder
        self.rules = rules
        # per node: the views the decisions were made on, and the decisions by request
        self._memo: dict[str, tuple[object, dict[tuple[object, ...], tuple[float, Decision]]]] = {}

    def decisions(
        self, pod: Mapping[str, Any], nodes: Sequence[str]
    ) -> tuple[dict[str, Decision], dict[str, str]]:
        """Per node: the agent's rules' decision, or why the node cannot be asked."""
        ask = parse_ask(pod)
        request = admission_of(pod, ask)
        decided: dict[str, Decision] = {}
        failed: dict[str, str] = {}
        now = time.time()
        for node in nodes:
            views = self.cache.views(node, without_request=request.request_id)
            if views is None:
                failed[node] = self.cache.why_unknown(node)
                continue
            decision = self._decided(node, request, views, now)
            if decision.admitted:
                decided[node] = decision
            else:
                failed[node] = f"{decision.reason}: {decision.message}"
        return decided, failed

    def _decided(
        self, node: str, request: AdmissionRequest, views: list[DeviceView], now: float
    ) -> Decision:
        """The rules' decision, made once for a pod's filter and then its prioritize: the
        same request on the same views (the cache builds a new list on any change)."""
        memo = self._memo.get(node)
        if memo is None or memo[0] is not views or len(memo[1]) > MEMO_SIZE:
            memo = self._memo[node] = (views, {})
        key = (
            request.request_id,
            request.tenant,
            request.trust_domain,
            request.priority,
            request.memory_bytes,
            request.thread_pct,
        )
        known = memo[1].get(key)
        if known is not None and now - known[0] <= MEMO_S:
            return known[1]
        decision = decide(request, views, self.rules, now=now)
        memo[1][key] = (now, decision)
        return decision

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        names = _node_names(args)
        # kube-scheduler skips prioritize when one node passes: expire here too
        self.cache.expire_assumed(time.monotonic())
        try:
            decided, failed = self.decisions(args.get("pod") or {}, names)
        except AnnotationError as exc:
            return {"nodenames": [], "failedAndUnresolvableNodes": dict.fromkeys(names, str(exc))}
        return {"nodenames": [n for n in names if n in decided], "failedNodes": failed}

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Best-fit across the idle nodes: the fuller the chosen device would be, the
        higher (2 to 10). A node with a bind in progress or waiting scores 1: its binds go
        one at a time (each waits for the previous pod's Allocate), so a burst of pods
        spreads over the idle nodes instead of queueing behind one. A node where the pod
        fits only by preempting other leases scores 0, below every node where it fits as
        it is: an eviction ends another pod, a queue only delays this one. Nodes that
        score the same tie, and kube-scheduler picks one of them at random."""
        names = _node_names(args)
        pod = args.get("pod") or {}
        self.cache.expire_assumed(time.monotonic())
        try:
            decided, _ = self.decisions(pod, names)
        except AnnotationError:
            return [{"Host": n, "Score": 0} for n in names]
        scores = {n: self._score(n, decided.get(n)) for n in names}
        self._assume_the_choice(pod, scores, decided)
        return [{"Host": n, "Score": score} for n, score in scores.items()]

    def _assume_the_choice(
        self, pod: Mapping[str, Any], scores: dict[str, int], decided: dict[str, Decision]
    ) -> None:
        """When one node scores above all others, kube-scheduler binds the pod there: its
        lease counts on that node's device until the bind (pods decided at the same moment
        would otherwise all pick the same best-fit device, and all but one be refused, or
        preempt, at the agent). With a tie the choice is random: nothing is assumed."""
        top = max(scores.values(), default=0)
        chosen = [n for n, score in scores.items() if score == top]
        uid = (pod.get("metadata") or {}).get("uid") or ""
        if top == 0 or len(chosen) != 1 or not uid:
            return
        [node] = chosen
        request, decision = admission_of(pod, parse_ask(pod)), decided[node]
        lease = pending_lease(  # reserved: never a victim of another pod's preemption
            request,
            decision.device_uuid or "",
            time.time(),
            lease_id=f"assumed-{uid}",
            state=LeaseState.RESERVED,
        )
        self.cache.assume(node, lease, until=time.monotonic() + ASSUMED_S)

    def _score(self, node: str, decision: Decision | None) -> int:
        if decision is None or decision.preempted_lease_ids:
            return 0
        if self.binder.queued[node]:
            return 1
        views = self.cache.views(node) or []
        chosen = [v for v in views if v.device.uuid == decision.device_uuid]
        if not chosen:
            return 0
        view = chosen[0]
        left = max(memory_left_bytes(view, self.rules), 0) / view.device.memory_bytes
        return 2 + round((MAX_SCORE - 2) * (1.0 - left))

    async def bind(self, args: Mapping[str, Any]) -> dict[str, str]:
        error = await self.binder.bind(
            _field(args, "PodNamespace"),
            _field(args, "PodName"),
            _field(args, "PodUID"),
            _field(args, "Node"),
        )
        return {"Error": error}


def _node_names(args: Mapping[str, Any]) -> list[str]:
    """``nodenames`` (nodeCacheCapable), else the names in ``nodes.items``."""
    names = args.get("nodenames")
    if names is not None:
        return [str(n) for n in names]
    items = (args.get("nodes") or {}).get("items") or []
    return [str((item.get("metadata") or {}).get("name", "")) for item in items]


def _field(args: Mapping[str, Any], name: str) -> str:
    """kube-scheduler sends binding args by their Go field names; accept any case."""
    for key, value in args.items():
        if key.lower() == name.lower():
            return str(value)
    return ""


def build_extender_app(extender: Extender) -> web.Application:
    async def read(request: web.Request) -> Any:
        try:
            return await request.json(loads=json.loads)
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"not JSON: {exc}") from exc

    async def filter_handler(request: web.Request) -> web.Response:
        return web.json_response(extender.filter(await read(request)))

    async def prioritize_handler(request: web.Request) -> web.Response:
        return web.json_response(extender.prioritize(await read(request)))

    async def bind_handler(request: web.Request) -> web.Response:
        return web.json_response(await extender.bind(await read(request)))

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_post("/filter", filter_handler)
    app.router.add_post("/prioritize", prioritize_handler)
    app.router.add_post("/bind", bind_handler)
    app.router.add_get("/healthz", healthz)
    return app
