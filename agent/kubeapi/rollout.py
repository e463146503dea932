"""Waiting until every pod of a DaemonSet is ready (``gpushare kube wait-rollout``): the
uninstall hook's Job waits so for its compute-mode reset, whose pods become ready on each
node once that node's GPUs are reset. First, with ``--delete-first``, it deletes another
DaemonSet (the agents', which would set the compute mode again): :func:`delete_first`.

Done is what the DaemonSet's controller says in ``status``: it has seen the latest spec
(``observedGeneration`` >= ``metadata.generation``), every pod it should schedule is ready
(``numberReady`` == ``desiredNumberScheduled``) and none is unavailable. A DaemonSet that
selects no node is done as soon as its controller has seen it. On a timeout the pods
(listed by the DaemonSet's selector) say which nodes are not ready, and why."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.kubeapi.port import DaemonSetApi, KubeError, NotFound, Obj

REFUSED = frozenset({401, 403})  # no wait makes these right: the account or its RBAC
# The DaemonSet object goes at once and the garbage collector deletes its pods after it:
# nothing is left to block a `helm upgrade` that brings it back (Foreground would keep the
# object, marked, until every pod is gone: for ever while a node is unreachable). What the
# reset waits for is not the pods' deletion but each agent's exit (its node lock).
PROPAGATION = "Background"
Echo = Callable[[str], None]


class RolloutRefused(KubeError):
    """The API server refuses this account the DaemonSet or its pods (401, 403)."""


@dataclass(frozen=True)
class Rollout:
    desired: int
    ready: int
    unavailable: int
    observed: bool  # the controller has seen the latest generation

    @property
    def done(self) -> bool:
        return self.observed and self.ready == self.desired and self.unavailable == 0

    def line(self) -> str:
        if not self.observed:
            return "waiting for the DaemonSet controller to see the DaemonSet"
        unavailable = f", {self.unavailable} unavailable" if self.unavailable else ""
        return f"{self.ready}/{self.desired} pods ready{unavailable}"


def rollout_of(daemon_set: Obj) -> Rollout:
    status = daemon_set.get("status") or {}
    generation = int((daemon_set.get("metadata") or {}).get("generation") or 0)
    return Rollout(
        desired=int(status.get("desiredNumberScheduled") or 0),
        ready=int(status.get("numberReady") or 0),
        unavailable=int(status.get("numberUnavailable") or 0),
        observed=int(status.get("observedGeneration") or 0) >= max(generation, 1),
    )


async def delete_first(
    api: DaemonSetApi,
    namespace: str,
    name: str,
    *,
    echo: Echo,
    attempts: int = 5,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Delete the DaemonSet ``name`` (propagation :data:`PROPAGATION`); one already gone is
    fine (a second try of the Job). A passing API error is tried again, ``attempts`` times
    in all, 1 s apart; then it is raised. 401 and 403 raise :class:`RolloutRefused`."""
    for attempt in range(1, attempts + 1):
        try:
            await api.delete_daemon_set(namespace, name, propagation=PROPAGATION)
            echo(f"daemonset/{name}: deleted (its pods go after it)")
            return
        except NotFound:
            echo(f"daemonset/{name}: not found in namespace {namespace}: gone already")
            return
        except KubeError as exc:
            if exc.status in REFUSED:
                raise _refused(exc, f"`delete` on daemonsets/{name} in {namespace}") from exc
            if attempt == attempts:
                raise
            echo(f"daemonset/{name}: cannot delete it ({exc}); trying again")
        await sleep(1.0)


def _refused(exc: KubeError, needed: str) -> RolloutRefused:
    said = str(exc).partition(": ")[2]
    return RolloutRefused(exc.status, exc.reason, f"{said} (this account needs {needed}: RBAC)")


def label_selector(daemon_set: Obj) -> str:
    """The DaemonSet's ``spec.selector`` as a label selector string."""
    selector = (daemon_set.get("spec") or {}).get("selector") or {}
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or [])
        terms.append(
            {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})"}.get(
                op, key if op == "Exists" else f"!{key}"
            )
        )
    return ",".join(terms)


def not_ready_lines(pods: list[Obj]) -> list[str]:
    """One line per pod that is not ready: its node, its name and what its container says."""
    lines = []
    for pod in sorted(pods, key=lambda p: str((p.get("spec") or {}).get("nodeName") or "")):
        status = pod.get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        if conditions.get("Ready") == "True":
            continue
        node = (pod.get("spec") or {}).get("nodeName") or "(not scheduled)"
        why = _container_words(status) or f"phase {status.get('phase') or 'Pending'}"
        lines.append(f"node {node}: pod {pod['metadata']['name']} not ready ({why})")
    return lines


def _container_words(status: Obj) -> str:
    """The first container's state in a few words, its last termination message included
    (the reset's failure, with terminationMessagePolicy FallbackToLogsOnError)."""
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        words = [w for w in (waiting.get("reason"), _terminated(last)) if w]
        if words:
            return "; ".join(words)
        if (container.get("state") or {}).get("running"):
            return "running, not ready yet"
    return ""


def _terminated(last: Obj) -> str:
    if not last:
        return ""
    message = " ".join(str(last.get("message") or "").split())
    return f"last exit {last.get('exitCode')}" + (f": {message}" if message else "")


async def wait_rollout(
    api: DaemonSetApi,
    namespace: str,
    name: str,
    *,
    timeout_s: float,
    interval_s: float,
    echo: Echo,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> bool:
    """Read the DaemonSet every ``interval_s`` until it is done (True) or ``timeout_s`` has
    passed (False, once the pods not ready are printed). Progress is printed as it changes;
    a passing API error is printed and waited out; 401 and 403 raise
    :class:`RolloutRefused`."""
    deadline = clock() + timeout_s
    said, last = "", None
    while True:
        daemon_set, words = await _read(api, namespace, name)
        if daemon_set is not None:
            last = daemon_set
            rollout = rollout_of(daemon_set)
            if rollout.done:
                echo(f"daemonset/{name}: {rollout.line()}: done")
                return True
            words = rollout.line()
        if words != said:
            echo(f"daemonset/{name}: {words}")
            said = words
        if clock() >= deadline:
            break
        await sleep(min(interval_s, max(deadline - clock(), 0.0)))
    echo(f"daemonset/{name}: not every pod ready after {timeout_s:g} s")
    for line in await _not_ready(api, namespace, last):
        echo(f"  {line}")
    return False


async def _read(api: DaemonSetApi, namespace: str, name: str) -> tuple[Obj | None, str]:
    try:
        return await api.get_daemon_set(namespace, name), ""
    except NotFound:
        return None, f"not found in namespace {namespace} (yet)"
    except KubeError as exc:
        if exc.status in REFUSED:
            raise _refused(exc, f"`get` on daemonsets in {namespace}") from exc
        return None, f"cannot read it ({exc}); trying again"


async def _not_ready(api: DaemonSetApi, namespace: str, daemon_set: Obj | None) -> list[str]:
    if daemon_set is None:
        return ["the DaemonSet was never read"]
    rollout = rollout_of(daemon_set)
    try:
        listed = await api.list_namespaced_pods(
            namespace, label_selector=label_selector(daemon_set)
        )
    except KubeError as exc:
        return [f"cannot list its pods: {exc}"]
    lines = not_ready_lines(listed.items)
    missing = rollout.desired - len(listed.items)
    if missing > 0:
        lines.append(f"{missing} of {rollout.desired} pods not created yet")
    return lines or [rollout.line()]
