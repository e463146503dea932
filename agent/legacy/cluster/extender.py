"""The kube-scheduler extender (``managedResources: gpushare.io/share``,
``nodeCacheCapable: true``): filter, prioritize and bind over HTTP, in kube-scheduler's
JSON types (``k8s.io/kube-scheduler/extender/v1``).

Filter and prioritize run the agents' own admission rules on the cached state of each
node, so a node filtered out carries the same sentence ``gpushare explain`` would print
there; bind asks the node's agent, which has the last word.

A body that is not the extender's JSON is answered HTTP 400 with what is wrong, and one log
line: over 4 MiB (413), not UTF-8 JSON, nested deeper than 64, of more than 100,000 values
or with a number of more than 100 digits (:func:`agent.legacy.cluster.bounded.load_json`, before it
is built), not an object, a ``pod`` that is not an object, ``nodenames`` that are not node
names (Kubernetes' DNS subdomain rule), ``nodes.items`` that are not nodes, or binding
arguments that are not the names of a pod and a node. kube-scheduler counts any status
but 200 as the call's failure and never sends such a body; the protocol's own answers (a
pod whose annotations do not parse: every node failed and unresolvable; a bind the agent
refused: ``Error``) stay HTTP 200.

The share's user (``kube serve --run-as-user``): with ``require_user`` (the default) a pod
whose share's containers do not state one UID fails every node with the same sentence
(:func:`agent.legacy.cluster.annotations.check_one_user`: the field and how to fix it), and the UID
goes into each decision, so a device whose MPS server runs as another UID is filtered out
(``USER_CONFLICT``), as its agent would refuse it. Without it (nodes whose MPS daemons run
multi-user) a stated UID is still sent, and the one-user rule is left to the agents: the
cached state does not say which nodes run multi-user.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web

from agent.admission.capacity import pending_lease
from agent.admission.policy import DeviceView, Rules, decide, memory_left_bytes
from agent.core import k8snames
from agent.core.lease import LeaseState
from agent.core.types import AdmissionRequest, Decision
from agent.legacy.cluster.annotations import AnnotationError, PodAsk, parse_ask
from agent.legacy.cluster.binder import Binder
from agent.legacy.cluster.bounded import Unreadable, load_json, printable, shown
from agent.legacy.cluster.cache import ASSUMED_S, AgentCache

log = logging.getLogger(__name__)

MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority
MEMO_S = 1.0  # a decision is reused while the node's views are the same, this long at most
MEMO_SIZE = 4096
# What kube-scheduler sends (ExtenderArgs, nodeCacheCapable): one pod, at most 1.5 MiB as
# etcd stores it, and the node names, at most 5,000 nodes (Kubernetes' documented largest
# cluster) of at most 253 characters, 1.3 MB; with room to spare. The costliest body within
# these limits takes under 100 ms of CPU and 50 MiB to read.
MAX_ARGS_BYTES = 4 * 2**20
MAX_ARGS_DEPTH = 64
MAX_ARGS_VALUES = 100_000
# binding argument (lower case) -> its rule (agent.core.k8snames)
_BINDING = {
    "podnamespace": k8snames.NAMESPACE,
    "podname": k8snames.OBJECT_NAME,
    "poduid": k8snames.UID,
    "node": k8snames.OBJECT_NAME,
}


class MalformedArgs(ValueError):
    """The body is not the extender's arguments: ``str()`` says what is wrong."""


def admission_of(ask: PodAsk) -> AdmissionRequest:
    return AdmissionRequest(
        request_id=ask.request_id or "filter",
        tenant=ask.tenant,
        trust_domain=ask.trust_domain,
        priority=ask.priority,
        memory_bytes=ask.memory_bytes,
        thread_pct=ask.thread_pct,
        run_as_uid=ask.run_as_uid,
    )


class Extender:
    def __init__(
        self, cache: AgentCache, binder: Binder, rules: Rules, *, require_user: bool = True
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.require_user = require_user
        self.rules = rules if require_user else replace(rules, one_user_per_device=False)
        # per node: the views the decisions were made on, and the decisions by request
        self._memo: dict[str, tuple[object, dict[tuple[object, ...], tuple[float, Decision]]]] = {}

    def decisions(
        self, pod: Mapping[str, Any], nodes: Sequence[str]
    ) -> tuple[dict[str, Decision], dict[str, str]]:
        """Per node: the agent's rules' decision, or why the node cannot be asked."""
        request = admission_of(parse_ask(pod, require_user=self.require_user))
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
            request.run_as_uid,
        )
        known = memo[1].get(key)
        if known is not None and now - known[0] <= MEMO_S:
            return known[1]
        decision = decide(request, views, self.rules, now=now)
        memo[1][key] = (now, decision)
        return decision

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        names, pod = _node_names(args), _pod(args)
        # kube-scheduler skips prioritize when one node passes: expire here too
        self.cache.expire_assumed(time.monotonic())
        try:
            decided, failed = self.decisions(pod, names)
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
        names, pod = _node_names(args), _pod(args)
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
        if top == 0 or len(chosen) != 1:
            return
        ask = parse_ask(pod)
        uid = ask.request_id
        if not uid:
            return
        [node] = chosen
        request, decision = admission_of(ask), decided[node]
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


def _pod(args: Mapping[str, Any]) -> Mapping[str, Any]:
    """``pod``: an object ({} when absent: its annotations are then found wanting)."""
    pod = args.get("pod")
    if pod is None:
        return {}
    if not isinstance(pod, dict):
        raise MalformedArgs(f"pod must be an object (got a JSON {_json_type(pod)})")
    return pod


def _node_names(args: Mapping[str, Any]) -> list[str]:
    """``nodenames`` (nodeCacheCapable), else the names in ``nodes.items``; each a
    Kubernetes node name, or :class:`MalformedArgs`."""
    names = args.get("nodenames")
    if names is not None:
        if not isinstance(names, list):
            raise MalformedArgs(f"nodenames must be a list (got a JSON {_json_type(names)})")
        return [_node_name(name, f"nodenames[{index}]") for index, name in enumerate(names)]
    nodes = args.get("nodes")
    if nodes is None:
        return []
    if not isinstance(nodes, dict):
        raise MalformedArgs(f"nodes must be a NodeList object (got a JSON {_json_type(nodes)})")
    items = nodes.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise MalformedArgs(f"nodes.items must be a list (got a JSON {_json_type(items)})")
    return [_item_name(item, f"nodes.items[{index}]") for index, item in enumerate(items)]


def _item_name(item: object, where: str) -> str:
    meta = item.get("metadata") if isinstance(item, dict) else None
    if not isinstance(meta, dict):
        raise MalformedArgs(f"{where} must be a Node with metadata")
    return _node_name(meta.get("name"), f"{where}.metadata.name")


def _node_name(value: object, where: str) -> str:
    return _name(value, where, k8snames.OBJECT_NAME)


def _name(value: object, where: str, rule: k8snames.NameRule) -> str:
    """``value`` when it is a string that keeps ``rule``, else :class:`MalformedArgs`
    saying why."""
    if not isinstance(value, str):
        raise MalformedArgs(f"{where} must be a string (got a JSON {_json_type(value)})")
    fault = rule.fault(value)
    if fault:
        raise MalformedArgs(f"{where} is not a Kubernetes name: it {fault} (got {shown(value)})")
    return value


def _field(args: Mapping[str, Any], name: str) -> str:
    """kube-scheduler sends binding args by their Go field names; accept any case. Each is
    required, and must be a Kubernetes name (a namespace, a pod, a uid, a node)."""
    rule = _BINDING[name.lower()]
    for key, value in args.items():
        if key.lower() == name.lower():
            return _name(value, name, rule)
    raise MalformedArgs(f"{name} is missing")


def _json_type(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return "true/false/null"
    names = {dict: "object", list: "array", str: "string", int: "number", float: "number"}
    return names.get(type(value), type(value).__name__)


def build_extender_app(extender: Extender) -> web.Application:
    async def read(request: web.Request) -> dict[str, Any]:
        try:
            args = load_json(
                await request.read(), max_depth=MAX_ARGS_DEPTH, max_values=MAX_ARGS_VALUES
            )
        except Unreadable as exc:
            raise refused(request, f"the body is not read: {exc}") from None
        if not isinstance(args, dict):
            what = f"a JSON {_json_type(args)}"
            raise refused(request, f"the body must be a JSON object, not {what}")
        return args

    def refused(request: web.Request, why: str) -> web.HTTPBadRequest:
        log.warning("extender %s: refused a malformed body: %s", request.path, printable(why))
        return web.HTTPBadRequest(text=why)

    async def filter_handler(request: web.Request) -> web.Response:
        try:
            return web.json_response(extender.filter(await read(request)))
        except MalformedArgs as exc:
            raise refused(request, str(exc)) from None

    async def prioritize_handler(request: web.Request) -> web.Response:
        try:
            return web.json_response(extender.prioritize(await read(request)))
        except MalformedArgs as exc:
            raise refused(request, str(exc)) from None

    async def bind_handler(request: web.Request) -> web.Response:
        try:
            return web.json_response(await extender.bind(await read(request)))
        except MalformedArgs as exc:
            raise refused(request, str(exc)) from None

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=MAX_ARGS_BYTES)
    app.router.add_post("/filter", filter_handler)
    app.router.add_post("/prioritize", prioritize_handler)
    app.router.add_post("/bind", bind_handler)
    app.router.add_get("/healthz", healthz)
    return app
