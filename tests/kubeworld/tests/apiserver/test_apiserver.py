"""The stand-in API server keeps the real one's semantics: resourceVersions, 404s, nodes,
events and endpoint slices, selectors, tokens, faults (patches, deletion and binding:
:mod:`.test_apiserver_pods`; watches: :mod:`.test_apiserver_watch`). Driven with a plain
HTTP client, as kubectl or client-go would."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.kubeworld.apiserver import (
    MERGE_PATCH,
    REASONS,
    STRATEGIC_PATCH,
    FakeApiServer,
)
from tests.kubeworld.tests.apiserver.raw import NS, PODS, Raw, assert_status, binding, manifest

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
