"""A stand-in for an unmodified kube-scheduler run as the second scheduler ``gpushare``
with our extender (``filterVerb``, ``prioritizeVerb``, ``bindVerb``, ``nodeCacheCapable``):
it takes the pending pods of its scheduler name from the API server, sends the extender
the real ExtenderArgs JSON, picks the highest score, delegates the bind, and on failure
records a ``FailedScheduling`` event worded like kube-scheduler's
("0/3 nodes are available: ...") and tries the pod again later."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

SCHEDULER = "gpushare"


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

    async def __aenter__(self) -> SchedulerStandIn:
        self.session = aiohttp.ClientSession(headers=self.headers)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def _post(self, url: str, body: Any) -> Any:
        assert self.session is not None
        async with self.session.post(url, json=body) as response:
            response.raise_for_status()
            return await response.json()

    async def pending(self) -> list[dict[str, Any]]:
        assert self.session is not None
        selector = f"spec.schedulerName={SCHEDULER},spec.nodeName="
        async with self.session.get(
            f"{self.api_url}/api/v1/pods", params={"fieldSelector": selector}
        ) as r:
            r.raise_for_status()
            items: list[dict[str, Any]] = (await r.json())["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    async def schedule(self, pod: dict[str, Any]) -> str | None:
        """One scheduling cycle of one pod: the node it was bound to, or None."""
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
        node = max(feasible, key=lambda n: (by_node.get(n, 0), -feasible.index(n)))
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
        return node

    async def failed(self, pod: dict[str, Any], message: str) -> None:
        meta = pod["metadata"]
        event = {
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
            "source": {"component": SCHEDULER},
        }
        await self._post(f"{self.api_url}/api/v1/namespaces/{meta['namespace']}/events", event)

    async def run(self, *, concurrency: int = 16) -> None:
        """Schedule pending pods until cancelled; binding cycles run side by side, as
        kube-scheduler's do."""
        busy: set[str] = set()
        limit = asyncio.Semaphore(concurrency)

        async def cycle(pod: dict[str, Any]) -> None:
            try:
                async with limit:
                    await self.schedule(pod)
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
