"""A stand-in for an unmodified kube-scheduler run as the second scheduler ``gpushare``
with our extender (``filterVerb``, ``prioritizeVerb``, ``bindVerb``, ``nodeCacheCapable``):
it follows the pending pods of its scheduler name (list, then watch, as its informer
does), sends the extender the real ExtenderArgs JSON, picks the highest score (ties at
random, as kube-scheduler does), delegates the bind, and on failure records a
``FailedScheduling`` event worded like kube-scheduler's ("0/3 nodes are available: ...")
and tries the pod again later."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

SCHEDULER = "gpushare"
UNBOUND = "spec.nodeName="


class SchedulerStandIn:
    def __init__(
        self, api_url: str, extender_url: str, nodes: list[str], *, token: str = ""
    ) -> None:
        self.api_url = api_url
        self.extender_url = extender_url
        self.nodes = nodes
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.session: aiohttp.ClientSession | None = None
        self.attempts: Counter[str] = Counter()
        self.retry_s = 0.2
        self._waiting: dict[str, dict[str, Any]] = {}  # uid -> pod, kept by follow()
        self._synced = asyncio.Event()
        self._informer: asyncio.Task[None] | None = None
        # pods it bound, not scheduled again while the watch has yet to show them bound
        # (kube-scheduler's cache "assumes" a pod it binds)
        self.bound: set[str] = set()

    async def __aenter__(self) -> SchedulerStandIn:
        self.session = aiohttp.ClientSession(headers=self.headers)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self.session is not None
        if self._informer is not None:
            self._informer.cancel()
            await asyncio.gather(self._informer, return_exceptions=True)
        await self.session.close()

    async def _post(self, url: str, body: Any) -> Any:
        assert self.session is not None
        async with self.session.post(url, json=body) as response:
            response.raise_for_status()
            return await response.json()

    async def pending(self) -> list[dict[str, Any]]:
        """The pods waiting for this scheduler, as its informer last saw them."""
        if self._informer is None:
            self._informer = asyncio.create_task(self.follow(), name="scheduler-informer")
        await self._synced.wait()
        return [
            p
            for p in self._waiting.values()
            if not p["metadata"].get("deletionTimestamp") and p["metadata"]["uid"] not in self.bound
        ]

    async def follow(self) -> None:
        """kube-scheduler's informer: list the unbound pods, then watch them from that
        resourceVersion, keeping those of this scheduler (kube-scheduler selects by node
        and filters the scheduler name itself); a watch that ends or expires (410) lists
        again."""
        assert self.session is not None
        url, selector = f"{self.api_url}/api/v1/pods", {"fieldSelector": UNBOUND}
        forever = aiohttp.ClientTimeout(total=None, sock_read=None)
        while True:
            try:
                async with self.session.get(url, params=selector) as r:
                    r.raise_for_status()
                    listing = await r.json()
                self._waiting = {p["metadata"]["uid"]: p for p in listing["items"] if mine(p)}
                self._synced.set()
                watch = {
                    **selector,
                    "watch": "true",
                    "resourceVersion": listing["metadata"]["resourceVersion"],
                    "timeoutSeconds": "60",
                }
                async with self.session.get(url, params=watch, timeout=forever) as r:
                    r.raise_for_status()
                    async for line in r.content:
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            break  # 410 Gone: list again
                        pod = event["object"]
                        if event["type"] == "DELETED":  # gone, or bound (left the selector)
                            self._waiting.pop(pod["metadata"]["uid"], None)
                        elif event["type"] in ("ADDED", "MODIFIED") and mine(pod):
                            self._waiting[pod["metadata"]["uid"]] = pod
            except (aiohttp.ClientError, TimeoutError, ValueError):
                await asyncio.sleep(self.retry_s)

    async def schedule(self, pod: dict[str, Any]) -> str | None:
        """One scheduling cycle of one pod, then its binding cycle: the node it was bound
        to, or None."""
        node = await self.choose(pod)
        return None if node is None else await self.bind(pod, node)

    async def choose(self, pod: dict[str, Any]) -> str | None:
        """The scheduling cycle: filter and prioritize through the extender, then one of
        the best nodes (None, with a FailedScheduling event, when none fits)."""
        meta = pod["metadata"]
        self.attempts[meta["uid"]] += 1
        args = {"pod": pod, "nodenames": self.nodes}
        filtered = await self._post(f"{self.extender_url}/filter", args)
        if filtered.get("error"):
            await self.failed(pod, f"extender error: {filtered['error']}")
            return None
        feasible = filtered.get("nodenames") or []
        if not feasible:
            failed = {
                **(filtered.get("failedNodes") or {}),
                **(filtered.get("failedAndUnresolvableNodes") or {}),
            }
            await self.failed(pod, unavailable(len(self.nodes), failed))
            return None
        scores = await self._post(
            f"{self.extender_url}/prioritize", {**args, "nodenames": feasible}
        )
        by_node = {s["Host"]: s["Score"] for s in scores}
        top = max(by_node.get(n, 0) for n in feasible)
        # kube-scheduler's selectHost: one of the highest scored nodes, at random
        return str(random.choice([n for n in feasible if by_node.get(n, 0) == top]))

    async def bind(self, pod: dict[str, Any], node: str) -> str | None:
        """The binding cycle: the extender's bind; the node, or None when refused."""
        meta = pod["metadata"]
        binding = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
        result = await self._post(f"{self.extender_url}/bind", binding)
        if result.get("Error"):
            await self.failed(pod, f"binding rejected: {result['Error']}")
            return None
        self.bound.add(meta["uid"])
        return node

    async def failed(self, pod: dict[str, Any], message: str) -> None:
        meta = pod["metadata"]
        event = failed_scheduling(pod, message, SCHEDULER)
        await self._post(f"{self.api_url}/api/v1/namespaces/{meta['namespace']}/events", event)

    async def run(self, *, concurrency: int = 16) -> None:
        """Schedule pending pods until cancelled: at most ``concurrency`` scheduling
        cycles at once (kube-scheduler runs one, this stand-in's calls are slower), each
        pod's binding cycle after it without a limit, as kube-scheduler's run."""
        busy: set[str] = set()
        limit = asyncio.Semaphore(concurrency)

        async def cycle(pod: dict[str, Any]) -> None:
            try:
                async with limit:
                    node = await self.choose(pod)
                if node is not None:
                    await self.bind(pod, node)
            except aiohttp.ClientError:  # the extender is down: kube-scheduler retries
                pass
            finally:
                await asyncio.sleep(self.retry_s)
                busy.discard(pod["metadata"]["uid"])

        async with _tasks() as spawn:
            while True:
                for pod in await self.pending():
                    if pod["metadata"]["uid"] not in busy:
                        busy.add(pod["metadata"]["uid"])
                        spawn(cycle(pod))
                await asyncio.sleep(0.02)


def failed_scheduling(pod: dict[str, Any], message: str, component: str) -> dict[str, Any]:
    """The Warning event kube-scheduler records about a pod it could not place."""
    meta = pod["metadata"]
    return {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        },
        "reason": "FailedScheduling",
        "message": message,
        "type": "Warning",
        "source": {"component": component},
    }


def mine(pod: dict[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("schedulerName") == SCHEDULER)


def unavailable(total: int, failed: dict[str, str]) -> str:
    """kube-scheduler's wording: the count of nodes per distinct reason."""
    counts = Counter(failed.values())
    parts = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    return f"0/{total} nodes are available: {parts}."


@contextlib.asynccontextmanager
async def _tasks() -> AsyncIterator[Any]:
    running: set[asyncio.Task[None]] = set()

    def spawn(coro: Any) -> None:
        task = asyncio.create_task(coro)
        running.add(task)
        task.add_done_callback(running.discard)

    try:
        yield spawn
    finally:
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
