"""The stand-in API server keeps the real one's semantics: resourceVersions, preconditions,
finalizers, watches from a version, expiry, bindings, status merges, selectors, errors.
Driven with a plain HTTP client, as kubectl or client-go would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.kube.apiserver import (
    JSON_PATCH,
    MERGE_PATCH,
    REASONS,
    STRATEGIC_PATCH,
    FakeApiServer,
)

NS = "team-a"
PODS = f"/api/v1/namespaces/{NS}/pods"
FINALIZER = "gpushare.io/lease"


class Raw:
    """A bare HTTP client of the stand-in: (status, decoded JSON body)."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(
            method, self.url + path, data=data, headers=headers, params=params
        ) as response:
            return response.status, await response.json(content_type=None)

    async def watch(self, path: str, **params: str) -> list[dict[str, Any]]:
        """Every event of one watch until the server ends it."""
        query = {"watch": "1", **params}
        async with self.session.get(self.url + path, params=query) as response:
            assert response.status == 200
            return [json.loads(line) async for line in response.content if line.strip()]


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(history=50) as server:
        yield server


@pytest.fixture
async def raw(api: FakeApiServer) -> AsyncIterator[Raw]:
    async with aiohttp.ClientSession() as session:
        yield Raw(session, api.url)


def assert_status(body: Any, code: int, reason: str) -> None:
    assert body["kind"] == "Status" and body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert (body["code"], body["reason"]) == (code, reason)
    assert body["message"]


def manifest(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **extra},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


# -- create, get, resourceVersion ----------------------------------------------------------


async def test_create_sets_the_server_fields_and_a_second_create_is_already_exists(
    raw: Raw,
) -> None:
    status, pod = await raw.call("POST", PODS, manifest("p"))
    assert status == 201
    meta = pod["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["namespace"] == NS and meta["resourceVersion"] == "1"
    assert pod["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"

    status, body = await raw.call("POST", PODS, manifest("p"))
    assert status == 409
    assert_status(body, 409, "AlreadyExists")
    status, body = await raw.call("POST", PODS, {"metadata": {"name": "q"}, "spec": {}})
    assert status == 422
    assert_status(body, 422, "Invalid")


async def test_every_write_takes_the_next_resource_version_and_a_no_op_none(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("a", NS)
    api.create_node("n1")
    _, b = await raw.call("POST", PODS, manifest("b"))
    assert b["metadata"]["resourceVersion"] == "3"
    _, patched = await raw.call(
        "PATCH", f"{PODS}/a", {"metadata": {"labels": {"x": "1"}}}, content_type=MERGE_PATCH
    )
    assert patched["metadata"]["resourceVersion"] == "4"
    _, same = await raw.call(
        "PATCH", f"{PODS}/a", {"metadata": {"labels": {"x": "1"}}}, content_type=MERGE_PATCH
    )
    assert same["metadata"]["resourceVersion"] == "4"  # nothing changed: nothing written
    _, listed = await raw.call("GET", "/api/v1/pods")
    assert listed["kind"] == "PodList" and listed["metadata"]["resourceVersion"] == "4"
    assert [p["metadata"]["name"] for p in listed["items"]] == ["a", "b"]
    assert "kind" not in listed["items"][0]  # list items carry no kind, as the real server's
    _, got = await raw.call("GET", f"{PODS}/a")
    assert got["kind"] == "Pod" and got["metadata"]["labels"] == {"x": "1"}


async def test_a_missing_pod_is_a_404_status(raw: Raw) -> None:
    status, body = await raw.call("GET", f"{PODS}/nope")
    assert status == 404
    assert_status(body, 404, "NotFound")
    assert body["message"] == 'pods "nope" not found'
    assert body["details"] == {"name": "nope", "kind": "pods"}
    for method in ("PATCH", "DELETE"):
        status, body = await raw.call(method, f"{PODS}/nope", {}, content_type=MERGE_PATCH)
        assert (status, body["reason"]) == (404, "NotFound")
    status, body = await raw.call("GET", "/api/v1/widgets")
    assert (status, body["reason"]) == (404, "NotFound")


# -- patches -------------------------------------------------------------------------------


async def test_a_patch_with_a_stale_resource_version_is_409_and_changes_nothing(
    api: FakeApiServer, raw: Raw
) -> None:
    pod = api.create_pod("p", NS, finalizers=[FINALIZER])
    stale = pod["metadata"]["resourceVersion"]
    api.set_pod_phase(NS, "p", "Running")  # someone else wrote in between

    patch = {"metadata": {"finalizers": [], "resourceVersion": stale}}
    status, body = await raw.call("PATCH", f"{PODS}/p", patch, content_type=MERGE_PATCH)
    assert status == 409
    assert_status(body, 409, "Conflict")
    assert "the object has been modified" in body["message"]
    ops = [{"op": "replace", "path": "/metadata/resourceVersion", "value": stale}]
    status, body = await raw.call("PATCH", f"{PODS}/p", ops, content_type=JSON_PATCH)
    assert (status, body["reason"]) == (409, "Conflict")
    assert api.pod(NS, "p")["metadata"]["finalizers"] == [FINALIZER]  # type: ignore[index]

    current = api.pod(NS, "p")["metadata"]["resourceVersion"]  # type: ignore[index]
    patch["metadata"]["resourceVersion"] = current
    status, body = await raw.call("PATCH", f"{PODS}/p", patch, content_type=MERGE_PATCH)
    assert status == 200
    assert body["metadata"]["finalizers"] == []
    assert int(body["metadata"]["resourceVersion"]) == int(current) + 1


async def test_json_patch_applies_its_ops_and_a_failing_test_is_422(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("p", NS, labels={"a": "1", "b": "2"}, finalizers=["x", "y"])
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "add", "path": "/metadata/labels/c~1d", "value": "3"},
        {"op": "remove", "path": "/metadata/labels/b"},
        {"op": "replace", "path": "/metadata/finalizers/0", "value": "z"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "w"},
    ]
    status, pod = await raw.call("PATCH", f"{PODS}/p", ops, content_type=JSON_PATCH)
    assert status == 200
    assert pod["metadata"]["labels"] == {"a": "1", "c/d": "3"}
    assert pod["metadata"]["finalizers"] == ["z", "y", "w"]

    failing = [{"op": "test", "path": "/metadata/labels/a", "value": "2"}, *ops[1:2]]
    status, body = await raw.call("PATCH", f"{PODS}/p", failing, content_type=JSON_PATCH)
    assert status == 422
    assert_status(body, 422, "Invalid")
    removing = [{"op": "remove", "path": "/metadata/labels/missing"}]
    status, body = await raw.call("PATCH", f"{PODS}/p", removing, content_type=JSON_PATCH)
    assert (status, body["reason"]) == (422, "Invalid")
    assert api.pod(NS, "p")["metadata"]["labels"] == {"a": "1", "c/d": "3"}  # type: ignore[index]


async def test_merge_patch_removes_with_null_and_replaces_lists(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("p", NS, annotations={"a": "1", "b": "2"}, finalizers=["x", "y"])
    patch = {"metadata": {"annotations": {"a": None, "c": "3"}, "finalizers": ["y"]}}
    for content_type in (MERGE_PATCH, STRATEGIC_PATCH):
        _, pod = await raw.call("PATCH", f"{PODS}/p", patch, content_type=content_type)
        assert pod["metadata"]["annotations"] == {"b": "2", "c": "3"}
        assert pod["metadata"]["finalizers"] == ["y"]  # strategic: replaced too (see module)
    status, body = await raw.call("PATCH", f"{PODS}/p", patch, content_type="text/plain")
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")


async def test_the_pod_resource_ignores_status_and_the_status_subresource_takes_only_it(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("p", NS)
    both = {"metadata": {"labels": {"x": "1"}}, "status": {"phase": "Running"}}
    _, pod = await raw.call("PATCH", f"{PODS}/p", both, content_type=MERGE_PATCH)
    assert pod["metadata"]["labels"] == {"x": "1"} and pod["status"]["phase"] == "Pending"
    both = {"metadata": {"labels": {"x": "2"}}, "status": {"phase": "Running"}}
    _, pod = await raw.call("PATCH", f"{PODS}/p/status", both, content_type=MERGE_PATCH)
    assert pod["metadata"]["labels"] == {"x": "1"} and pod["status"]["phase"] == "Running"


async def test_a_pod_spec_is_immutable_but_for_images(api: FakeApiServer, raw: Raw) -> None:
    api.create_pod("p", NS)
    moved = {"spec": {"nodeName": "n1"}}
    status, body = await raw.call("PATCH", f"{PODS}/p", moved, content_type=MERGE_PATCH)
    assert (status, body["reason"]) == (422, "Invalid")
    ops = [{"op": "replace", "path": "/spec/containers/0/image", "value": "busybox:1.37"}]
    status, pod = await raw.call("PATCH", f"{PODS}/p", ops, content_type=JSON_PATCH)
    assert status == 200 and pod["spec"]["containers"][0]["image"] == "busybox:1.37"


# -- deletion and finalizers ---------------------------------------------------------------


async def test_finalizers_hold_a_deleted_pod_until_they_are_removed(
    api: FakeApiServer, raw: Raw
) -> None:
    pod = api.create_pod("p", NS, node_name="n1", finalizers=[FINALIZER])
    since = pod["metadata"]["resourceVersion"]
    status, deleting = await raw.call("DELETE", f"{PODS}/p")
    assert status == 200
    assert deleting["metadata"]["deletionTimestamp"]
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 30
    status, still = await raw.call("GET", f"{PODS}/p")
    assert status == 200 and still["metadata"]["deletionTimestamp"]

    status, body = await raw.call(
        "PATCH", f"{PODS}/p", {"metadata": {"finalizers": ["other"]}}, content_type=MERGE_PATCH
    )
    assert (status, body["reason"]) == (422, "Invalid")  # no new finalizers while deleting

    status, last = await raw.call(
        "PATCH", f"{PODS}/p", {"metadata": {"finalizers": None}}, content_type=MERGE_PATCH
    )
    assert status == 200
    status, _ = await raw.call("GET", f"{PODS}/p")
    assert status == 404
    events = await raw.watch("/api/v1/pods", resourceVersion=since, timeoutSeconds="1")
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert events[0]["object"]["metadata"]["deletionTimestamp"]
    assert events[1]["object"]["metadata"]["resourceVersion"] == api.resource_version
    assert last["metadata"]["uid"] == pod["metadata"]["uid"]


async def test_a_force_delete_waits_for_the_finalizers_too(api: FakeApiServer, raw: Raw) -> None:
    api.create_pod("p", NS, node_name="n1", finalizers=[FINALIZER])
    status, deleting = await raw.call("DELETE", f"{PODS}/p", params={"gracePeriodSeconds": "0"})
    assert status == 200
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 0
    assert api.pod(NS, "p") is not None
    api.create_pod("q", NS, node_name="n1", finalizers=[FINALIZER])
    status, _ = await raw.call("DELETE", f"{PODS}/q", {"gracePeriodSeconds": 0})  # in the body
    assert status == 200
    assert api.pod(NS, "q")["metadata"]["deletionGracePeriodSeconds"] == 0  # type: ignore[index]
    api.create_pod("r", NS, node_name="n1", finalizers=[FINALIZER])
    api.delete_pod(NS, "r", force=True)
    assert api.pod(NS, "r")["metadata"]["deletionGracePeriodSeconds"] == 0  # type: ignore[index]
    ops = [{"op": "remove", "path": "/metadata/finalizers"}]
    status, _ = await raw.call("PATCH", f"{PODS}/q", ops, content_type=JSON_PATCH)
    assert status == 200 and api.pod(NS, "q") is None


async def test_a_pod_without_finalizers_is_deleted_at_once_and_preconditions_hold(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("p", NS, node_name="n1")
    status, body = await raw.call("DELETE", f"{PODS}/p", {"preconditions": {"uid": "other"}})
    assert (status, body["reason"]) == (409, "Conflict")
    assert api.pod(NS, "p") is not None
    status, _ = await raw.call("DELETE", f"{PODS}/p")
    assert status == 200 and api.pod(NS, "p") is None


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


# -- binding -------------------------------------------------------------------------------


def binding(name: str, node: str, uid: str = "") -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, **({"uid": uid} if uid else {})}
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"kind": "Node", "name": node},
    }


async def test_binding_sets_the_node_once_then_is_409(api: FakeApiServer, raw: Raw) -> None:
    pod = api.create_pod("p", NS, scheduler_name="gpushare")
    uid = pod["metadata"]["uid"]
    status, body = await raw.call("POST", f"{PODS}/p/binding", binding("p", "n1", uid="other"))
    assert (status, body["reason"]) == (409, "Conflict")
    assert "Precondition failed: UID" in body["message"]

    status, body = await raw.call("POST", f"{PODS}/p/binding", binding("p", "n1", uid=uid))
    assert status == 201 and body["status"] == "Success"
    bound = api.pod(NS, "p")
    assert bound is not None and bound["spec"]["nodeName"] == "n1"
    assert {"type": "PodScheduled", "status": "True"}.items() <= bound["status"]["conditions"][
        0
    ].items()
    assert int(bound["metadata"]["resourceVersion"]) == int(pod["metadata"]["resourceVersion"]) + 1

    status, body = await raw.call("POST", f"{PODS}/p/binding", binding("p", "n2"))
    assert status == 409
    assert_status(body, 409, "Conflict")
    assert 'pod p is already assigned to node "n1"' in body["message"]
    status, body = await raw.call("POST", f"{PODS}/nope/binding", binding("nope", "n1"))
    assert (status, body["reason"]) == (404, "NotFound")


# -- nodes, events, endpoint slices --------------------------------------------------------


async def test_node_status_patches_merge_conditions_by_type(api: FakeApiServer, raw: Raw) -> None:
    status, _ = await raw.call("POST", "/api/v1/nodes", {"metadata": {"name": "n1"}, "status": {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "MemoryPressure", "status": "False"},
        ]
    }})  # fmt: skip
    assert status == 201
    patch = {
        "status": {
            "conditions": [
                {"type": "GpushareReady", "status": "False", "reason": "AgentDown"},
                {"type": "Ready", "status": "False"},
            ]
        }
    }
    status, node = await raw.call(
        "PATCH", "/api/v1/nodes/n1/status", patch, content_type=STRATEGIC_PATCH
    )
    assert status == 200
    assert node["status"]["conditions"] == [
        {"type": "Ready", "status": "False"},
        {"type": "MemoryPressure", "status": "False"},
        {"type": "GpushareReady", "status": "False", "reason": "AgentDown"},
    ]
    # a merge patch replaces the list, as RFC 7386 says
    _, node = await raw.call("PATCH", "/api/v1/nodes/n1/status", patch, content_type=MERGE_PATCH)
    assert [c["type"] for c in node["status"]["conditions"]] == ["GpushareReady", "Ready"]

    labels = {"metadata": {"labels": {"gpushare.io/agent": "ready"}}, "status": {"phase": "x"}}
    _, node = await raw.call("PATCH", "/api/v1/nodes/n1", labels, content_type=MERGE_PATCH)
    assert node["metadata"]["labels"] == {"gpushare.io/agent": "ready"}
    assert "phase" not in node["status"]  # the main resource ignores status
    status, body = await raw.call("PATCH", "/api/v1/nodes/n9", labels, content_type=MERGE_PATCH)
    assert (status, body["reason"]) == (404, "NotFound")
    status, body = await raw.call("POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
    assert (status, body["reason"]) == (409, "AlreadyExists")


async def test_events_are_stored_listed_and_found_by_pod(api: FakeApiServer, raw: Raw) -> None:
    for reason in ("FailedScheduling", "Scheduled"):
        event = {
            "metadata": {"generateName": "p.", "namespace": NS},
            "involvedObject": {"kind": "Pod", "namespace": NS, "name": "p", "uid": "u1"},
            "reason": reason,
            "message": "0/3 nodes are available",
            "type": "Warning",
        }
        status, created = await raw.call("POST", f"/api/v1/namespaces/{NS}/events", event)
        assert status == 201 and created["metadata"]["name"].startswith("p.")
    await raw.call("POST", f"/api/v1/namespaces/{NS}/events", {
        "metadata": {"name": "other.1"}, "involvedObject": {"kind": "Pod", "name": "other"},
    })  # fmt: skip
    assert [e["reason"] for e in api.events_for("p")] == ["FailedScheduling", "Scheduled"]
    _, listed = await raw.call(
        "GET", "/api/v1/events", params={"fieldSelector": "involvedObject.name=p,reason=Scheduled"}
    )
    assert listed["kind"] == "EventList"
    assert [e["reason"] for e in listed["items"]] == ["Scheduled"]


async def test_endpoint_slices_are_listed_by_service(api: FakeApiServer, raw: Raw) -> None:
    api.set_endpoints("gpushare-system", "gpushare-agent", [("n1", "10.0.0.1")], port=50051)
    api.set_endpoints(
        "gpushare-system", "gpushare-agent", [("n1", "10.0.0.1"), ("n2", "10.0.0.2")], port=50051
    )
    api.set_endpoints("gpushare-system", "other", [("n3", "10.0.0.3")], port=80)
    path = "/apis/discovery.k8s.io/v1/namespaces/gpushare-system/endpointslices"
    params = {"labelSelector": "kubernetes.io/service-name=gpushare-agent"}
    _, listed = await raw.call("GET", path, params=params)
    assert listed["kind"] == "EndpointSliceList"
    assert listed["apiVersion"] == "discovery.k8s.io/v1"
    (only,) = listed["items"]  # set_endpoints replaces the service's slice
    assert [e["nodeName"] for e in only["endpoints"]] == ["n1", "n2"]
    assert only["ports"] == [{"name": "grpc", "port": 50051, "protocol": "TCP"}]
    assert only["endpoints"][1]["addresses"] == ["10.0.0.2"]


# -- selectors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "labels", "names"),
    [
        ("spec.nodeName=n1", "", ["bound"]),
        ("spec.nodeName=", "", ["pending", "other"]),
        ("spec.schedulerName=gpushare,spec.nodeName=", "", ["pending"]),
        ("spec.schedulerName!=gpushare", "", ["other"]),
        ("metadata.name==other", "", ["other"]),
        ("status.phase=Running", "", ["bound"]),
        ("", "app=train", ["bound", "pending"]),
        ("", "app!=train", ["other"]),
        ("", "app in (train,serve),tier", ["bound"]),
        ("", "app notin (train)", ["other"]),
        ("", "!tier", ["pending", "other"]),
        ("spec.schedulerName=gpushare", "tier=gold", ["bound"]),
    ],
)
async def test_field_and_label_selectors(
    api: FakeApiServer, raw: Raw, fields: str, labels: str, names: list[str]
) -> None:
    api.create_pod(
        "bound", NS, scheduler_name="gpushare", node_name="n1", phase="Running",
        labels={"app": "train", "tier": "gold"},
    )  # fmt: skip
    api.create_pod("pending", NS, scheduler_name="gpushare", labels={"app": "train"})
    api.create_pod("other", "team-b", labels={"app": "web"})
    params = {k: v for k, v in (("fieldSelector", fields), ("labelSelector", labels)) if v}
    _, listed = await raw.call("GET", "/api/v1/pods", params=params)
    assert sorted(p["metadata"]["name"] for p in listed["items"]) == sorted(names)


async def test_an_unknown_field_selector_is_a_400(raw: Raw) -> None:
    status, body = await raw.call("GET", "/api/v1/pods", params={"fieldSelector": "spec.image=x"})
    assert status == 400
    assert_status(body, 400, "BadRequest")


# -- auth, faults, counters ----------------------------------------------------------------


async def test_a_token_is_required_when_set() -> None:
    async with FakeApiServer(token="s3cret") as api, aiohttp.ClientSession() as session:
        raw = Raw(session, api.url)
        status, body = await raw.call("GET", "/api/v1/pods")
        assert status == 401
        assert_status(body, 401, "Unauthorized")
    async with (
        FakeApiServer(token="s3cret") as api,
        aiohttp.ClientSession(headers={"Authorization": "Bearer s3cret"}) as session,
    ):
        status, _ = await Raw(session, api.url).call("GET", "/api/v1/pods")
        assert status == 200


async def test_fail_next_answers_matching_requests_with_a_status(
    api: FakeApiServer, raw: Raw
) -> None:
    api.create_pod("p", NS)
    api.fail_next("GET", r"/pods/p$", 503, times=2)
    for _ in range(2):
        status, body = await raw.call("GET", f"{PODS}/p")
        assert status == 503
        assert_status(body, 503, "ServiceUnavailable")
    status, _ = await raw.call("GET", "/api/v1/pods")  # does not match
    assert status == 200
    status, _ = await raw.call("GET", f"{PODS}/p")
    assert status == 200
    assert api.requests == {"get": 3, "list": 1}
    # aiohttp tries an idempotent request again once when a reused connection breaks
    api.fail_next("GET", r"/pods/p$", 0, times=2)
    with pytest.raises(aiohttp.ClientError):
        await raw.call("GET", f"{PODS}/p")


@pytest.mark.parametrize(
    ("status", "landed", "hang", "answered", "bound"),
    [
        (500, False, False, 500, False),  # refused: nothing done
        (500, True, False, 500, True),  # a 5xx whose write landed
        (503, True, False, 503, True),
        (0, False, False, None, False),  # the connection breaks before the write
        (0, True, False, None, True),  # ... after it
        (0, False, True, None, False),  # no answer within the client's timeout
        (0, True, True, None, True),  # ... and the write was made
        (409, True, False, 409, True),  # a conflict answered for a write that landed
    ],
)
async def test_a_fault_answers_a_write_whether_or_not_it_landed(
    api: FakeApiServer,
    status: int,
    landed: bool,
    hang: bool,
    answered: int | None,
    bound: bool,
) -> None:
    pod = api.create_pod("p", NS)
    api.fail_next("POST", r"/pods/p/binding$", status, landed=landed, hang=hang)
    body = json.dumps(binding("p", "n1", uid=pod["metadata"]["uid"]))
    url = f"{api.url}{PODS}/p/binding"
    timeout = aiohttp.ClientTimeout(total=0.5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        if answered is None:  # no answer: a break, or the client's own timeout
            with pytest.raises((aiohttp.ClientError, TimeoutError)):
                async with session.post(url, data=body) as response:
                    await response.read()
        else:
            async with session.post(url, data=body) as response:
                assert response.status == answered
                assert_status(await response.json(), answered, REASONS[answered])
        stored = api.pod(NS, "p")
        assert stored is not None
        assert stored["spec"].get("nodeName", "") == ("n1" if bound else "")
        assert api.faults == []  # used once
        async with session.post(url, data=body) as response:  # the next is served
            assert response.status == (409 if bound else 201)


async def test_a_hanging_request_is_dropped_once_its_client_goes(api: FakeApiServer) -> None:
    """The client's timeout ends the hold at once (not after HANG_S): the server stops in
    its usual time, and a write held without landing is never made."""
    api.create_pod("p", NS)
    api.fail_next("POST", r"/pods/p/binding$", hang=True)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
        body = json.dumps(binding("p", "n1"))
        post = asyncio.ensure_future(session.post(f"{api.url}{PODS}/p/binding", data=body))
        async with asyncio.timeout(2):
            while not api.hanging:  # held
                await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError):
            await post
    async with asyncio.timeout(2):
        while api.hanging:
            await asyncio.sleep(0.01)
    stored = api.pod(NS, "p")
    assert stored is not None and "nodeName" not in stored["spec"]
