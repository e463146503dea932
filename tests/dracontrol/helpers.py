"""What the controller's tests share: claims as the scheduler leaves them (allocated, their
shares waiting for ``gpushare.io/admitted``), a decider that plays the node agents'
``AnswerClaim`` (the same answer when asked again) and records every ask, and the
controller running against the API stand-in."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from agent.dra.claims import pending_conditions
from agent.dracontrol.controller import BindingController
from agent.dracontrol.port import ShareAnswerValue, Unreached
from agent.kubeapi.port import Obj
from agent.kubeapi.rest import RestKubeApi
from tests.kubeworld.apiserver import FakeApiServer

DRIVER = "gpushare.io"
NODE = "node-a"
STATUS = r"/namespaces/ns/resourceclaims/c/status"


def claim(
    name: str, *devices: str, node: str = NODE, driver: str = DRIVER, binding: bool = True
) -> Obj:
    """A claim allocated to ``devices`` of ``node`` (one share each), waiting for its
    binding condition unless ``binding`` is False."""
    return claim_on(name, [(node, d) for d in devices], driver=driver, binding=binding)


def claim_on(
    name: str, placed: Iterable[tuple[str, str]], *, driver: str = DRIVER, binding: bool = True
) -> Obj:
    results = []
    for i, (node, device) in enumerate(placed):
        result: Obj = {
            "request": "gpu",
            "driver": driver,
            "pool": node,
            "device": device,
            "shareID": f"5e0e2d4c-1111-4222-8333-00000000000{i}",
        }
        if binding:
            result["bindingConditions"] = ["gpushare.io/admitted"]
            result["bindingFailureConditions"] = ["gpushare.io/refused"]
        results.append(result)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]}
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


class Agents:
    """The nodes' agents as the controller sees them: a device in ``full`` refuses (all of
    the claim's shares on that node, as an agent does), a node in ``down`` is not reached.
    Asked again about a claim, an agent answers the same and admits nothing twice."""

    def __init__(self, *, full: Iterable[str] = (), down: Iterable[str] = ()) -> None:
        self.full = set(full)
        self.down = set(down)
        self.asks: list[tuple[str, str]] = []  # (node, claim name), in order
        self.leases: set[tuple[str, str, str]] = set()  # (claim uid, device, share id)
        self.reason = "NO_MEMORY"

    async def answer(self, node: str, claim: Obj) -> list[ShareAnswerValue]:
        self.asks.append((node, claim["metadata"]["name"]))
        await asyncio.sleep(0)
        if node in self.down:
            raise Unreached(f"the agent of {node}: UNAVAILABLE: connection refused")
        waiting = pending_conditions(claim, DRIVER, node)
        uid = claim["metadata"]["uid"]
        if any(s.device in self.full for s in waiting):
            for s in waiting:
                self.leases.discard((uid, s.device, s.share_id))
            return [
                ShareAnswerValue(s.device, s.share_id, False, self.reason, f"{s.device} is full")
                for s in waiting
            ]
        for s in waiting:
            self.leases.add((uid, s.device, s.share_id))
        return [
            ShareAnswerValue(s.device, s.share_id, True, "Admitted", f"lease on {s.device}")
            for s in waiting
        ]


@contextlib.asynccontextmanager
async def controlling(
    kube: RestKubeApi, agents: Any, *, backoff_s: float = 0.05, **options: Any
) -> AsyncIterator[BindingController]:
    """The controller running (unelected); ``options``: its own."""
    controller = BindingController(
        kube,
        agents,
        backoff_s=backoff_s,
        backoff_max_s=options.pop("backoff_max_s", 0.2),
        **options,
    )
    task = asyncio.create_task(controller.run())
    try:
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def stored(api: FakeApiServer, name: str = "c") -> Obj | None:
    found = [x for x in api.objects("resourceclaims") if x["metadata"]["name"] == name]
    return found[0] if found else None


def conditions(api: FakeApiServer, name: str = "c") -> list[tuple[str, str, str]]:
    claim = stored(api, name)
    assert claim is not None
    return [
        (d["device"], c["type"], c["reason"])
        for d in (claim.get("status") or {}).get("devices") or []
        for c in d["conditions"]
    ]


def status_writes(api: FakeApiServer, path: str = STATUS) -> int:
    return sum(1 for method, p, _ in api.log if method == "PUT" and p.endswith(path))


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


def tasks_of(name: str) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"answer-ns/{name}"]
