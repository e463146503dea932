"""The stand-in API server's watches as the real one's: from a resourceVersion every later
change in order, the current objects first without one, selectors entering and leaving,
410 Expired past the bounded history, lists of an exact old version, bookmarks on request,
and a watch whose client goes is dropped."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.kubeworld.apiserver import (
    MERGE_PATCH,
    FakeApiServer,
)
from tests.kubeworld.tests.apiserver.raw import FINALIZER, NS, PODS, Raw, assert_status

# -- watches -------------------------------------------------------------------------------


async def test_a_watch_from_a_resource_version_sees_every_later_change_in_order(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("before", NS)
    since = api.resource_version
    api.create_pod("a", NS, finalizers=[FINALIZER])
    api.create_node("n1")  # another resource: not in a pod watch
    api.set_pod_phase(NS, "a", "Running")
    watching = asyncio.create_task(
        raw.watch("/api/v1/pods", resourceVersion=since, timeoutSeconds="1")
    )
    await asyncio.sleep(0.2)  # the backlog is sent; the rest comes live
    api.create_pod("b", "team-b")
    api.delete_pod(NS, "a")
    await raw.call("PATCH", f"{PODS}/a", {"metadata": {"finalizers": []}}, content_type=MERGE_PATCH)
    events = await watching
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in events]
    assert seen == [
        ("ADDED", "a"),
        ("MODIFIED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert all(e["object"]["kind"] == "Pod" for e in events)

    namespaced = await raw.watch(PODS, resourceVersion=since, timeoutSeconds="1")
    assert "b" not in {e["object"]["metadata"]["name"] for e in namespaced}


async def test_a_watch_without_a_version_starts_with_the_current_pods(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("a", NS)
    api.create_pod("b", NS)
    events = await raw.watch("/api/v1/pods", timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]


async def test_a_watch_with_a_selector_sees_pods_enter_and_leave_it(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("p", NS, labels={"team": "x"})
    since = api.resource_version
    for value in ("y", "x"):
        await raw.call(
            "PATCH",
            f"{PODS}/p",
            {"metadata": {"labels": {"team": value}}},
            content_type=MERGE_PATCH,
        )
    events = await raw.watch(
        "/api/v1/pods", resourceVersion=since, labelSelector="team=x", timeoutSeconds="1"
    )
    assert [e["type"] for e in events] == ["DELETED", "ADDED"]


async def test_a_watch_older_than_the_history_gets_an_expired_error_event(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("a", NS)
    since = api.resource_version
    api.create_pod("b", NS)
    api.compact()
    events = await raw.watch("/api/v1/pods", resourceVersion="1", timeoutSeconds="5")
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert_status(events[0]["object"], 410, "Expired")
    assert "too old resource version" in events[0]["object"]["message"]
    assert since == "1"

    api.create_pod("c", NS)  # from the compaction point on, the history is there again
    events = await raw.watch(
        "/api/v1/pods", resourceVersion=api.resource_version, timeoutSeconds="1"
    )
    assert events == []
    events = await raw.watch("/api/v1/pods", resourceVersion="2", timeoutSeconds="1")
    assert [e["object"]["metadata"]["name"] for e in events] == ["c"]


async def test_the_history_is_bounded(api: FakeApiServer, raw: Raw) -> None:
    for i in range(60):  # the fixture keeps 50 changes
        api.create_pod(f"p{i}", NS)
    events = await raw.watch("/api/v1/pods", resourceVersion="5", timeoutSeconds="5")
    assert [e["type"] for e in events] == ["ERROR"]
    events = await raw.watch("/api/v1/pods", resourceVersion="15", timeoutSeconds="1")
    assert len(events) == 45


async def test_a_list_of_an_exact_old_version_is_that_version_until_compacted(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("a", NS)
    api.create_pod("b", NS)
    params = {"resourceVersion": "1", "resourceVersionMatch": "Exact"}
    status, body = await raw.call("GET", "/api/v1/pods", params=params)
    assert status == 200 and [p["metadata"]["name"] for p in body["items"]] == ["a"]
    assert body["metadata"]["resourceVersion"] == "1"
    status, body = await raw.call("GET", "/api/v1/pods", params={"resourceVersion": "1"})
    assert status == 200 and len(body["items"]) == 2  # not older than: the current state
    api.compact()
    status, body = await raw.call("GET", "/api/v1/pods", params=params)
    assert status == 410
    assert_status(body, 410, "Expired")


async def test_bookmarks_go_only_to_watches_that_ask(api: FakeApiServer, raw: Raw) -> None:
    since = api.resource_version
    plain = asyncio.create_task(
        raw.watch("/api/v1/pods", resourceVersion=since, timeoutSeconds="1")
    )
    asking = asyncio.create_task(
        raw.watch(
            "/api/v1/pods", resourceVersion=since, timeoutSeconds="1", allowWatchBookmarks="true"
        )
    )
    while len(api.watchers) < 2:
        await asyncio.sleep(0.01)
    api.create_pod("a", NS)
    api.bookmark()
    assert [e["type"] for e in await plain] == ["ADDED"]
    got = await asking
    assert [e["type"] for e in got] == ["ADDED", "BOOKMARK"]
    assert got[1]["object"]["metadata"]["resourceVersion"] == api.resource_version


async def test_a_watch_that_the_client_leaves_is_dropped(api: FakeApiServer) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.get(
            api.url + "/api/v1/pods", params={"watch": "true", "timeoutSeconds": "30"}
        )
        while not api.watchers:
            await asyncio.sleep(0.01)
        response.close()
    for _ in range(100):
        if not api.watchers:
            break
        await asyncio.sleep(0.02)
    assert not api.watchers
