"""The faults of ``bench/kubernetes.py --faults``: the stand-in API server answers a share of
the requests that carry the pod flow the way a real API server, etcd or the network can,
and agents are killed (SIGKILL) in the middle of binds.

Each faulted request is answered one way, drawn at random:

- a Binding (``POST .../pods/<name>/binding``): a 500 that landed (the pod is bound, the
  answer says it failed) or did not, no answer before the client's timeout (landed or
  not), a 409 that landed (as a retried POST whose first attempt was bound), a connection
  reset after the write or before it;
- a pod patch (``PATCH .../pods/<name>``: the controller's finalizer removals): the same,
  with a 409 that did not land (a stale resourceVersion) instead;
- a pod watch (``GET ...pods?watch=true``): a 410 (the version expired: list again), a
  500, a reset; every watch is also ended every few seconds (:func:`end_watches`, as the
  server ends one at its ``timeoutSeconds``), so the watchers connect again, and again
  draw;
- a read of one pod (``GET .../pods/<name>``: the binder's read-backs): a 500, a reset, no
  answer.

A kill happens when a Binding arrives for a node whose agent is up (at most one agent
down at a time, at least ``kill_every_s`` apart): the node's agent is SIGKILLed before the
Binding is served, so the pod is bound while its agent is away, between the agent's grant
and the kubelet's Allocate; the agent is started again ``restart_after_s`` later.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.kubeworld.apiserver import Fault


@dataclass(frozen=True, slots=True)
class Answer:
    name: str
    status: int  # 0: the connection breaks (or, with hang, no answer at all)
    landed: bool = False
    hang: bool = False

    def fault(self, request: web.Request) -> Fault:
        reason = {409: "Conflict", 410: "Expired", 500: "InternalError"}.get(self.status, "")
        return Fault(
            request.method,
            re.compile(re.escape(request.path)),
            self.status,
            reason,
            f"injected by the benchmark: {self.name}",
            1,
            landed=self.landed,
            hang=self.hang,
        )


WRITES = (
    Answer("500-landed", 500, landed=True),
    Answer("500", 500),
    Answer("timeout-landed", 0, landed=True, hang=True),
    Answer("timeout", 0, hang=True),
    Answer("reset-landed", 0, landed=True),
    Answer("reset", 0),
)
BINDING_ANSWERS = (*WRITES, Answer("409-landed", 409, landed=True))
PATCH_ANSWERS = (*WRITES, Answer("409", 409))
WATCH_ANSWERS = (Answer("410", 410), Answer("500", 500), Answer("reset", 0))
READ_ANSWERS = (Answer("500", 500), Answer("reset", 0), Answer("timeout", 0, hang=True))
_BINDING = re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/binding$")
_POD = re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+$")
_PODS = re.compile(r"^/api/v1/(namespaces/[^/]+/)?pods$")


def kind_of(request: web.Request) -> str:
    """Which of the faulted kinds a request is ("" for none)."""
    if request.method == "POST" and _BINDING.match(request.path):
        return "binding"
    if request.method == "PATCH" and _POD.match(request.path):
        return "patch"
    if request.method == "GET" and _PODS.match(request.path) and _watching(request):
        return "watch"
    if request.method == "GET" and _POD.match(request.path):
        return "read"
    return ""


def _watching(request: web.Request) -> bool:
    return request.query.get("watch") in ("1", "true", "True")


ANSWERS = {
    "binding": BINDING_ANSWERS,
    "patch": PATCH_ANSWERS,
    "watch": WATCH_ANSWERS,
    "read": READ_ANSWERS,
}


@dataclass
class Chaos:
    """The stand-in API server's fault hook (:attr:`FakeApiServer.chaos`)."""

    share: float
    rng: random.Random
    kill: Callable[[str], bool] | None = None  # SIGKILL a node's agent; False if it is down
    kill_every_s: float = 10.0
    kills_left: int = 0
    answered: Counter[str] = field(default_factory=Counter)  # "<kind> <answer>" -> count
    seen: Counter[str] = field(default_factory=Counter)  # kind -> requests
    kills: int = 0
    _last_kill: float = 0.0

    async def __call__(self, request: web.Request) -> Fault | None:
        kind = kind_of(request)
        if not kind:
            return None
        self.seen[kind] += 1
        if kind == "binding" and await self._killed_mid_bind(request):
            return None  # served as it is, its node's agent away
        if self.rng.random() >= self.share:
            return None
        answer = self.rng.choice(ANSWERS[kind])
        self.answered[f"{kind} {answer.name}"] += 1
        return answer.fault(request)

    async def _killed_mid_bind(self, request: web.Request) -> bool:
        now = time.monotonic()
        if self.kill is None or self.kills_left <= 0 or now - self._last_kill < self.kill_every_s:
            return False
        with contextlib.suppress(ValueError, KeyError, TypeError):
            body: Any = await request.json()
            if self.kill(str(body["target"]["name"])):
                self.kills_left -= 1
                self.kills += 1
                self._last_kill = now
                return True
        return False

    def report(self) -> dict[str, Any]:
        return {
            "share": self.share,
            "requests": dict(self.seen),
            "answered": dict(sorted(self.answered.items())),
            "agents_killed_mid_bind": self.kills,
        }


async def end_watches(end: Callable[[], None], every_s: float) -> None:
    """End every open watch every ``every_s`` (a benchmark task, until cancelled)."""
    while True:
        await asyncio.sleep(every_s)
        end()


async def restart_later(start: Callable[[], Any], after_s: float) -> None:
    """Start a killed agent again after a while (its kubelet registers it again)."""
    await asyncio.sleep(after_s)
    start()
