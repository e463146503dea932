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

from agent.admission.policy import DeviceView, Rules, decide, memory_left_bytes
from agent.core.types import AdmissionRequest, Decision
from agent.kube.annotations import AnnotationError, PodAsk, parse_ask
from agent.kube.binder import Binder
from agent.kube.cache import AgentCache

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
        try:
            decided, failed = self.decisions(args.get("pod") or {}, names)
        except AnnotationError as exc:
            return {"nodenames": [], "failedAndUnresolvableNodes": dict.fromkeys(names, str(exc))}
        return {"nodenames": [n for n in names if n in decided], "failedNodes": failed}

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Best-fit across the idle nodes: the fuller the chosen device would be, the
        higher (1 to 10). A node with a bind in progress or waiting scores 0: its binds go
        one at a time (each waits for the previous pod's Allocate), so a burst of pods
        spreads over the idle nodes instead of queueing behind one; when every node that
        fits is busy, they tie and kube-scheduler picks one at random."""
        names = _node_names(args)
        try:
            decided, _ = self.decisions(args.get("pod") or {}, names)
        except AnnotationError:
            return [{"Host": n, "Score": 0} for n in names]
        queued = self.binder.queued
        return [
            {"Host": n, "Score": 0 if queued[n] else self._score(n, decided.get(n))} for n in names
        ]

    def _score(self, node: str, decision: Decision | None) -> int:
        views = self.cache.views(node) or []
        chosen = [
            v for v in views if decision is not None and v.device.uuid == decision.device_uuid
        ]
        if not chosen:
            return 0
        view = chosen[0]
        left = max(memory_left_bytes(view, self.rules), 0) / view.device.memory_bytes
        return 1 + round((MAX_SCORE - 1) * (1.0 - left))

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
