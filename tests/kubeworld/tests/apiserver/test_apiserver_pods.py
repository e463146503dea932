"""The stand-in API server keeps the real one's semantics for the writes of a pod: patches
(merge, JSON, strategic), the status subresource, the immutable spec, deletion held by
finalizers and preconditions, and the binding subresource. Driven with a plain HTTP client,
as kubectl or client-go would."""

from __future__ import annotations

from tests.kubeworld.apiserver import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    FakeApiServer,
)
from tests.kubeworld.tests.apiserver.raw import FINALIZER, NS, PODS, Raw, assert_status, binding

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


# -- binding -------------------------------------------------------------------------------


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
