"""The lease controller against a stale view and slow writes: the reconcile asks the API
before it releases a lease whose pod its watch has not shown (the watch may be behind),
and the watch is never held up by the releases and finalizer writes of ended pods."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.kubeapi.port import KubeError, NotFound, Obj
from agent.legacy.cluster.annotations import FINALIZER, LEASE_ANNOTATION
from agent.legacy.cluster.cache import AgentCache, NodeEntry
from agent.legacy.cluster.controller import LeaseController
from agent.legacy.cluster.views import lease_of

NODE = "node-a"
NOW = 1_000.0


def pod(name: str, *, node: str = "", lease: str = "", phase: str = "Pending") -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "finalizers": [FINALIZER],
            "annotations": {LEASE_ANNOTATION: lease} if lease else {},
        },
        "spec": {"schedulerName": "gpushare", **({"nodeName": node} if node else {})},
        "status": {"phase": phase},
    }


def lease(name: str, *, created_at: float = NOW - 600) -> pb.Lease:
    return pb.Lease(
        lease_id=f"L-{name}",
        request_id=f"uid-{name}",
        pod=f"team/{name}",
        state="admitted",
        created_at=created_at,  # type: ignore[arg-type]
    )


class Api:
    def __init__(self, *pods: Obj) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.reads: list[str] = []
        self.fail_reads = False
        self.patches: list[str] = []
        self.deleted: list[tuple[str, str]] = []  # name, uid
        self.events: list[Obj] = []

    async def delete_pod(self, namespace: str, name: str, *, uid: str) -> None:
        self.deleted.append((name, uid))

    async def create_event(self, namespace: str, event: Obj) -> None:
        self.events.append(event)

    async def get_pod(self, namespace: str, name: str) -> Obj:
        self.reads.append(name)
        if self.fail_reads:
            raise KubeError(500, "InternalError", "etcd is slow")
        if name not in self.pods:
            raise NotFound(404, "NotFound", name)
        return self.pods[name]

    async def patch_pod(self, namespace: str, name: str, patch: Obj) -> Obj:
        self.patches.append(name)
        self.pods[name]["metadata"]["finalizers"] = patch["metadata"]["finalizers"]
        return self.pods[name]


class Link:
    def __init__(self) -> None:
        self.released: list[str] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.failing = False

    async def release(self, lease_id: str) -> None:
        await self.hold.wait()
        if self.failing:
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE)
        self.released.append(lease_id)


class Cache:
    def __init__(self, *leases: pb.Lease) -> None:
        self.the_link = Link()
        entry = NodeEntry(NODE, "127.0.0.1:9807")
        entry.snapshot = pb.GetNodeResponse(leases=list(leases))
        self.nodes = {NODE: entry}
        self.listeners: list[Any] = []

    def link(self, node: str) -> Link | None:
        return self.the_link if node in self.nodes else None

    def why_unknown(self, node: str) -> str:
        return "no agent"

    def live_leases(self, node: str) -> list[pb.Lease]:
        entry = self.nodes.get(node)
        return list(entry.snapshot.leases) if entry is not None and entry.snapshot else []

    def forget_assumed(self, pod_uid: str, *, only: object = None) -> None:
        pass


def controller(api: Api, cache: Cache) -> LeaseController:
    made = LeaseController(api, cache, grace_s=60, clock=lambda: NOW)  # type: ignore[arg-type]
    made.acting = True  # as while act() runs (the leader's): handle() settles
    return made


@pytest.mark.parametrize(
    ("in_api", "released"),
    [
        pytest.param(None, True, id="gone from the API"),
        pytest.param(pod("p"), False, id="unbound: a bind under way"),
        pytest.param(pod("p", node=NODE, lease="L-p"), False, id="bound here with it"),
        pytest.param(pod("p", node="node-b"), True, id="bound elsewhere"),
        pytest.param(pod("p", node=NODE, phase="Succeeded"), True, id="ended"),
        pytest.param({**pod("p"), "metadata": {**pod("p")["metadata"], "uid": "x"}}, True,
                     id="another pod of that name"),
    ],
)  # fmt: skip
async def test_the_reconcile_asks_the_api_about_a_pod_its_watch_has_not_shown(
    in_api: Obj | None, released: bool
) -> None:
    api = Api(*([in_api] if in_api else []))
    cache = Cache(lease("p"))
    leases = controller(api, cache)  # its view is empty: the watch is behind
    assert await leases.reconcile() == int(released)
    assert api.reads == ["p"]
    assert cache.the_link.released == (["L-p"] if released else [])


async def test_a_lease_is_kept_while_the_api_cannot_say() -> None:
    api = Api(pod("p"))
    api.fail_reads = True
    cache = Cache(lease("p"))
    assert await controller(api, cache).reconcile() == 0
    assert cache.the_link.released == []


async def test_a_pod_the_view_holds_is_judged_without_a_read() -> None:
    api = Api()
    cache = Cache(lease("live"), lease("done"))
    leases = controller(api, cache)
    await leases.handle(pod("live", node=NODE, lease="L-live"))
    leases.pods["uid-done"] = pod("done", node=NODE, phase="Failed")  # ended, seen
    assert await leases.reconcile() == 1
    assert api.reads == [] and cache.the_link.released == ["L-done"]


async def test_the_watch_goes_on_while_an_ended_pod_is_settled() -> None:
    ended = pod("p", node=NODE, lease="L-p", phase="Succeeded")
    api = Api(ended)
    cache = Cache(lease("p"))
    cache.the_link.hold.clear()  # the agent's release is slow
    leases = controller(api, cache)
    await asyncio.wait_for(leases.handle(ended), 1.0)
    await asyncio.wait_for(leases.handle(pod("q")), 1.0)
    assert "uid-q" in leases.pods and api.patches == []
    cache.the_link.hold.set()
    await _until(lambda: api.patches == ["p"])
    assert cache.the_link.released == ["L-p"]
    assert api.pods["p"]["metadata"]["finalizers"] == []


def real_cache(*shown: pb.Lease) -> tuple[AgentCache, Link]:
    """The cache itself, its agent's last answer ``shown``, no connection behind it."""
    cache = AgentCache(lambda target: None)  # type: ignore[arg-type,return-value]
    entry = cache.nodes[NODE] = NodeEntry(NODE, "127.0.0.1:9807")
    entry.snapshot = pb.GetNodeResponse(leases=list(shown))
    entry.link = link = Link()  # type: ignore[assignment]
    return cache, link


async def test_a_pod_that_ends_before_any_answer_showed_its_lease_gets_it_released() -> None:
    """A pod that runs for a second: its lease is still the bind's, pending in the cache."""
    ended = pod("p", node=NODE, lease="L-p", phase="Succeeded")
    api = Api(ended)
    cache, link = real_cache()
    granted = lease("p", created_at=NOW)
    granted.priority = "burstable"
    cache.add_pending(NODE, lease_of(granted))
    await controller(api, cache).handle(ended)  # type: ignore[arg-type]
    await _until(lambda: api.patches == ["p"])
    assert link.released == ["L-p"]


@pytest.mark.parametrize("ended_since", [False, True], ids=["live", "its end came"])
async def test_the_reconcile_releases_an_orphan_once(ended_since: bool) -> None:
    api = Api()  # its pod is gone
    cache, link = real_cache(lease("p"))
    if ended_since:
        cache.nodes[NODE].ended["L-p"] = 7  # released since the answer, by its pod's settling
    assert await controller(api, cache).reconcile() == (0 if ended_since else 1)  # type: ignore[arg-type]
    assert link.released == ([] if ended_since else ["L-p"])


async def test_a_settling_that_gave_up_is_tried_again_by_the_reconcile() -> None:
    ended = pod("p", node=NODE, lease="L-p", phase="Failed")
    api = Api(ended)
    cache = Cache(lease("p", created_at=NOW))  # young: only the settling releases it
    cache.the_link.failing = True
    leases = controller(api, cache)
    await leases.handle(ended)
    await _until(lambda: not leases._settling)
    assert api.patches == [], "the finalizer stays while the lease may be live"
    cache.the_link.failing = False
    await leases.reconcile()
    await _until(lambda: api.patches == ["p"])
    assert cache.the_link.released == ["L-p"]


@pytest.mark.parametrize("event_first", [False, True], ids=["pod seen first", "event first"])
async def test_a_pod_whose_lease_its_agent_evicted_is_deleted(event_first: bool) -> None:
    bound = pod("p", node=NODE, lease="L-p", phase="Running")
    api, cache = Api(bound), Cache()
    leases = controller(api, cache)
    evicted = pb.Event(
        kind="lease.evicted",
        lease_id="L-p",
        message="preempted by L-g",
        attrs={"request_id": "uid-p/1"},  # the pod's second lease
    )
    other = pb.Event(
        kind="lease.evicted",
        lease_id="L-x",
        message="device degraded",
        attrs={"request_id": "uid-x"},
    )
    steps = [
        lambda: leases.handle(bound),
        lambda: _emit(cache, evicted),
        lambda: _emit(cache, other),
    ]
    for step in steps[::-1] if event_first else steps:
        await step()
    await _until(lambda: api.deleted == [("p", "uid-p")])
    assert [e["reason"] for e in api.events] == ["LeaseEvicted"]
    assert "preempted by L-g" in api.events[0]["message"]
    await leases.handle(bound)  # seen again: deleted once
    await asyncio.sleep(0.05)
    assert api.deleted == [("p", "uid-p")] and leases.evicted_pods == 1


async def test_a_pod_pointing_its_annotation_at_an_evicted_lease_is_not_deleted() -> None:
    intruder = pod("q", node=NODE, lease="L-p", phase="Running")  # L-p is pod p's
    api, cache = Api(intruder), Cache()
    leases = controller(api, cache)
    await leases.handle(intruder)
    event = pb.Event(kind="lease.evicted", lease_id="L-p", attrs={"request_id": "uid-p"})
    await _emit(cache, event)
    await asyncio.sleep(0.05)
    assert api.deleted == []


async def test_the_deletion_is_tried_again_and_the_event_is_best_effort() -> None:
    bound = pod("p", node=NODE, lease="L-p", phase="Running")
    api, cache = Api(bound), Cache()
    failures = [KubeError(503, "ServiceUnavailable", "busy")]
    real_delete = api.delete_pod

    async def flaky_delete(namespace: str, name: str, *, uid: str) -> None:
        if failures:
            raise failures.pop()
        await real_delete(namespace, name, uid=uid)

    async def no_event(namespace: str, event: Obj) -> None:
        raise KubeError(500, "InternalError", "events are down")

    api.delete_pod = flaky_delete  # type: ignore[method-assign]
    api.create_event = no_event  # type: ignore[method-assign]
    leases = controller(api, cache)
    await leases.handle(bound)
    event = pb.Event(kind="lease.evicted", lease_id="L-p", attrs={"request_id": "uid-p"})
    await _emit(cache, event)
    await _until(lambda: api.deleted == [("p", "uid-p")], timeout_s=3.0)
    assert leases.evicted_pods == 1


async def _emit(cache: Cache, event: pb.Event) -> None:
    for listener in cache.listeners:
        listener(NODE, event)


async def _until(predicate: Any, timeout_s: float = 2.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


def _rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")


async def test_a_replica_not_leading_follows_the_pods_and_writes_nothing() -> None:
    """Every replica keeps the pods in view (its extender's binds read them there); only
    while act() runs (the leader's) are ended pods settled, the ones that ended before
    first."""
    ended = pod("p", node=NODE, lease="L-p", phase="Succeeded")
    api = Api(ended)
    cache = Cache(lease("p"))
    following = LeaseController(api, cache, grace_s=60, clock=lambda: NOW)  # type: ignore[arg-type]
    forgotten: list[str] = []
    cache.forget_assumed = forgotten.append  # type: ignore[method-assign]
    await following.handle(ended)
    await following.handle(pod("gone"), deleted=True)
    assert following.pod("uid-p") is ended and forgotten == ["uid-gone"]
    await asyncio.sleep(0.05)
    assert cache.the_link.released == [] and api.patches == [] and not following._tasks

    following._synced.set()  # (follow() sets it after its first list)
    acting = asyncio.create_task(following.act())
    await _until(lambda: api.patches == ["p"])
    assert cache.the_link.released == ["L-p"]
    acting.cancel()  # leadership lost
    await asyncio.gather(acting, return_exceptions=True)
    assert not following.acting
    await following.handle(pod("q", node=NODE, phase="Failed"))
    assert api.patches == ["p"] and not following._tasks


async def test_a_release_cut_by_its_connection_closing_is_a_failed_release() -> None:
    """grpc.aio ends a call with CancelledError when its channel closes (the agent's
    stream broke and the cache dropped the link): the reconcile goes on, not stops."""
    cache = Cache(lease("p"))

    async def closed(lease_id: str) -> None:
        raise asyncio.CancelledError

    cache.the_link.release = closed  # type: ignore[method-assign]
    leases = controller(Api(), cache)
    assert await leases.release(NODE, "L-p", why="test") is False
    assert await leases.reconcile() == 0  # goes on


async def test_the_write_side_reports_a_part_that_ends() -> None:
    from agent.legacy.cluster.service import raise_ended

    async def quits() -> None:
        return None

    task = asyncio.create_task(quits(), name="lease-controller")
    await task
    with pytest.raises(RuntimeError, match="lease-controller ended"):
        raise_ended({task})
