"""``RestKubeApi``'s watches against the stand-in API server: every change after a version in
order, bookmarks, expiry as ``Gone``, an informer that lists again after an expired watch
or a compaction without missing a change, and a claim watch that decodes only what
mentions its node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

from agent.kubeapi.port import (
    Gone,
    KubeApi,
    KubeError,
    Obj,
    WatchEvent,
)
from agent.kubeapi.rest import RestKubeApi
from tests.kubeworld.apiserver import FakeApiServer

TOKEN = "adapter-test-token"
NS = "team-a"
FINALIZER = "gpushare.io/lease"
MINE = "spec.schedulerName=gpushare"


async def collect(
    kube: KubeApi, version: str, count: int, *, field_selector: str = "", timeout_s: float = 30
) -> list[WatchEvent]:
    """The first ``count`` events of a watch (fewer if it ends), then the watch is closed."""
    seen: list[WatchEvent] = []
    async with contextlib.aclosing(
        kube.watch_pods(version, field_selector=field_selector, timeout_s=timeout_s)
    ) as events:
        async for event in events:
            seen.append(event)
            if len(seen) == count:
                break
    return seen


# -- watches -------------------------------------------------------------------------------


async def test_a_watch_yields_every_change_after_its_version_in_order(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    api.create_pod("old", NS, scheduler_name="gpushare")
    listing = await kube.list_pods(field_selector=MINE)
    watching = asyncio.create_task(collect(kube, listing.resource_version, 5, field_selector=MINE))
    pod = api.create_pod("p", NS, scheduler_name="gpushare", finalizers=[FINALIZER])
    api.create_pod("not-mine", NS)
    await kube.bind_pod(NS, "p", pod["metadata"]["uid"], "n1")
    api.set_pod_phase(NS, "p", "Succeeded")
    api.delete_pod(NS, "p")
    await kube.patch_pod(NS, "p", {"metadata": {"finalizers": []}})
    events = await asyncio.wait_for(watching, 10)
    assert [(e.kind, e.obj["metadata"]["name"]) for e in events] == [
        ("ADDED", "p"),
        ("MODIFIED", "p"),
        ("MODIFIED", "p"),
        ("MODIFIED", "p"),
        ("DELETED", "p"),
    ]
    assert events[1].obj["spec"]["nodeName"] == "n1"
    assert events[2].obj["status"]["phase"] == "Succeeded"
    assert events[3].obj["metadata"]["deletionTimestamp"]
    assert events[4].obj["metadata"]["resourceVersion"] == api.resource_version
    await until(lambda: not api.watchers)  # closing the iterator closed the stream


async def test_bookmarks_are_passed_through_and_the_watch_ends_at_its_timeout(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    watching = asyncio.create_task(collect(kube, api.resource_version, 10, timeout_s=1))
    await wait_for_watch(api)
    api.create_pod("p", NS)
    api.bookmark()
    events = await asyncio.wait_for(watching, 10)  # ends by itself after about a second
    assert [e.kind for e in events] == ["ADDED", "BOOKMARK"]
    assert events[1].obj["metadata"]["resourceVersion"] == api.resource_version
    (watch_request,) = [path for method, path, _ in api.log if "watch=" in path]
    assert "allowwatchbookmarks=true" in watch_request.lower()
    assert "timeoutSeconds=1" in watch_request


async def test_an_expired_watch_raises_gone(api: FakeApiServer, kube: RestKubeApi) -> None:
    api.create_pod("a", NS)
    version = api.resource_version
    api.create_pod("b", NS)
    api.compact()
    with pytest.raises(Gone) as caught:
        await collect(kube, version, 1)
    assert (caught.value.status, caught.value.reason) == (410, "Expired")
    api.fail_next("GET", r"watch=", 410)  # a plain 410 answer to the watch request
    with pytest.raises(Gone):
        await collect(kube, api.resource_version, 1)
    api.fail_next("GET", r"watch=", 500)
    with pytest.raises(KubeError) as failed:
        await collect(kube, api.resource_version, 1)
    assert failed.value.status == 500


class Informer:
    """What client-go's reflector does: list, watch from the list's version, watch again
    from the last version seen when a watch ends, list again on Gone. The cache it keeps
    must end equal to the server's pods."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self.pods: dict[str, Obj] = {}
        self.version = ""
        self.lists = 0
        self.gone = 0

    async def run(self) -> None:
        while True:
            if not self.version:
                listing = await self.kube.list_pods(field_selector=MINE)
                self.lists += 1
                self.pods = {p["metadata"]["name"]: p for p in listing.items}
                self.version = listing.resource_version
            try:
                async with contextlib.aclosing(
                    self.kube.watch_pods(self.version, field_selector=MINE)
                ) as events:
                    async for event in events:
                        name = event.obj["metadata"].get("name", "")
                        if event.kind == "DELETED":
                            self.pods.pop(name, None)
                        elif event.kind != "BOOKMARK":
                            self.pods[name] = event.obj
                        self.version = event.obj["metadata"]["resourceVersion"]
            except Gone:
                self.gone += 1
                self.version = ""


async def test_a_watch_that_expires_is_listed_again_and_misses_nothing(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    for i in range(3):
        api.create_pod(f"p{i}", NS, scheduler_name="gpushare", finalizers=[FINALIZER])
    informer = Informer(kube)
    running = asyncio.create_task(informer.run())
    try:
        await wait_for_watch(api)
        api.set_pod_phase(NS, "p0", "Running")
        await settle(informer, api)

        # the server ends the watch; before it is watched again pods change and the
        # history is compacted (all before the next await: nothing runs in between)
        for watcher in list(api.watchers):
            watcher.queue.put_nowait(None)
        api.create_pod("p3", NS, scheduler_name="gpushare")
        api.delete_pod(NS, "p1")
        api.patch_pod(NS, "p1", {"metadata": {"finalizers": []}})
        api.set_pod_phase(NS, "p2", "Failed")
        api.compact()
        await settle(informer, api)
        assert (informer.gone, informer.lists) == (1, 2)  # the old version expired: listed

        api.create_pod("p4", NS, scheduler_name="gpushare")
        api.create_pod("ignored", NS)
        await settle(informer, api)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError, KubeError):
            await running
    expected = {p["metadata"]["name"]: p for p in api.objects["pods"].values()}
    expected.pop("ignored")
    assert set(informer.pods) == {"p0", "p2", "p3", "p4"}
    assert {n: p["metadata"]["resourceVersion"] for n, p in informer.pods.items()} == {
        n: p["metadata"]["resourceVersion"] for n, p in expected.items()
    }
    assert informer.pods["p2"]["status"]["phase"] == "Failed"


async def test_the_watch_after_compaction_is_gone_then_the_relist_catches_up(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    """The exact sequence: a version from before the compaction gets Gone; a new list
    holds the changes made meanwhile; a watch from its version sees only what follows."""
    api.create_pod("a", NS, scheduler_name="gpushare")
    before = (await kube.list_pods(field_selector=MINE)).resource_version
    api.create_pod("b", NS, scheduler_name="gpushare")
    api.compact()
    with pytest.raises(Gone):
        await collect(kube, before, 1, field_selector=MINE)
    listing = await kube.list_pods(field_selector=MINE)
    assert [p["metadata"]["name"] for p in listing.items] == ["a", "b"]
    watching = asyncio.create_task(collect(kube, listing.resource_version, 1, field_selector=MINE))
    api.create_pod("c", NS, scheduler_name="gpushare")
    (event,) = await asyncio.wait_for(watching, 10)
    assert (event.kind, event.obj["metadata"]["name"]) == ("ADDED", "c")


async def until(condition: Callable[[], bool], what: str = "the condition") -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what} did not hold within 5 s")


async def wait_for_watch(api: FakeApiServer) -> None:
    await until(lambda: bool(api.watchers), "a watch")


async def settle(informer: Informer, api: FakeApiServer) -> None:
    """Until the informer's cache holds the server's versions of its pods."""
    for _ in range(500):
        want = {
            p["metadata"]["name"]: p["metadata"]["resourceVersion"]
            for p in api.objects["pods"].values()
            if p["spec"].get("schedulerName") == "gpushare"
        }
        have = {n: p["metadata"]["resourceVersion"] for n, p in informer.pods.items()}
        if want == have and api.watchers:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the informer did not catch up: {have} != {want}")


def claim(name: str, node: str) -> Obj:
    result = {"request": "gpu", "driver": "gpushare.io", "pool": node, "device": "gpu-0"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c"}}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


async def test_a_claim_watch_decodes_only_what_mentions_the_node(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    start = (await kube.list_resource_claims()).resource_version
    mine = api.put_object("resourceclaims", claim("mine", "node-a"))
    other = api.put_object("resourceclaims", claim("other", "node-b"))
    seen: list[WatchEvent] = []
    async with contextlib.aclosing(
        kube.watch_resource_claims(start, timeout_s=5, mentioning='"node-a"')
    ) as events:
        async for event in events:
            seen.append(event)
            if len(seen) == 2:
                break
    assert [e.kind for e in seen] == ["ADDED", "BOOKMARK"]
    assert seen[0].obj["metadata"]["name"] == "mine"
    # the other node's claim, undecoded: only where to resume from
    assert seen[1].obj == {"metadata": {"resourceVersion": other["metadata"]["resourceVersion"]}}
    assert mine["metadata"]["resourceVersion"] != other["metadata"]["resourceVersion"]
