"""The stand-in API server's resource.k8s.io/v1: the verbs, the status subresource, generated
names, preconditions, selectors, watches, the test helpers and versions (decoding and
validation: :mod:`.test_apiserver_dra_validation`). Driven over plain HTTP."""

from __future__ import annotations

import asyncio
import copy

import pytest

from tests.kubeworld.apiserver import (
    JSON_PATCH,
    MERGE_PATCH,
    ApiError,
    FakeApiServer,
    kube_versions,
)
from tests.kubeworld.tests.apiserver_dra.client import (
    ALL_CLAIMS,
    CLAIMS,
    CLASSES,
    DRIVER,
    GENERATED,
    GROUP,
    NS,
    SLICES,
    TEMPLATES,
    Body,
    Client,
    admitted,
    allocated_claim,
    allocation,
    cause,
    claim,
    created,
    device_class,
    failure,
    gpu,
    resource_slice,
    template,
)

# -- the verbs -----------------------------------------------------------------------------


async def test_device_classes_are_created_listed_replaced_and_deleted(client: Client) -> None:
    made = await created(client, CLASSES, {**device_class(), "metadata": {"name": DRIVER}})
    meta = made["metadata"]
    assert made["kind"] == "DeviceClass" and made["apiVersion"] == "resource.k8s.io/v1"
    assert meta["uid"] and meta["generation"] == 1 and "namespace" not in meta
    reply = await client.call("GET", CLASSES)
    assert reply.body["kind"] == "DeviceClassList"
    assert [i["metadata"]["name"] for i in reply.body["items"]] == [DRIVER]
    assert "kind" not in reply.body["items"][0]

    changed = copy.deepcopy(made)
    changed["spec"]["selectors"][0]["cel"]["expression"] = "true"
    reply = await client.call("PUT", f"{CLASSES}/{DRIVER}", changed)
    assert reply.status == 200 and reply.body["metadata"]["generation"] == 2
    assert int(reply.body["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])

    reply = await client.call("DELETE", f"{CLASSES}/{DRIVER}")
    assert reply.status == 200 and reply.body["metadata"]["name"] == DRIVER
    body = failure(await client.call("GET", f"{CLASSES}/{DRIVER}"), 404, "NotFound")
    assert body["message"] == f'deviceclasses.resource.k8s.io "{DRIVER}" not found'
    assert body["details"] == {"name": DRIVER, "group": "resource.k8s.io", "kind": "deviceclasses"}
    again = await client.call("POST", CLASSES, device_class())
    assert again.status == 201
    body = failure(await client.call("POST", CLASSES, device_class()), 409, "AlreadyExists")
    assert body["message"] == f'deviceclasses.resource.k8s.io "{DRIVER}" already exists'


async def test_claims_are_listed_by_namespace_and_across_namespaces(client: Client) -> None:
    await created(client, CLAIMS, claim("a"))
    await created(client, f"{GROUP}/namespaces/team-b/resourceclaims", claim("b", "team-b"))
    await created(client, TEMPLATES, template())
    namespaced = (await client.call("GET", CLAIMS)).body
    everywhere = (await client.call("GET", ALL_CLAIMS)).body
    assert namespaced["kind"] == everywhere["kind"] == "ResourceClaimList"
    assert [i["metadata"]["name"] for i in namespaced["items"]] == ["a"]
    assert [i["metadata"]["namespace"] for i in everywhere["items"]] == [NS, "team-b"]
    templates = (await client.call("GET", f"{GROUP}/resourceclaimtemplates")).body
    assert [i["metadata"]["name"] for i in templates["items"]] == ["t"]
    reply = await client.call("POST", CLAIMS, claim("x", "team-b"))
    assert failure(reply, 400, "BadRequest")


async def test_a_created_claim_has_an_empty_status_whatever_was_sent(client: Client) -> None:
    made = await created(client, CLAIMS, {**claim(), "status": {"allocation": allocation()}})
    assert made["status"] == {}
    assert made["metadata"]["generation"] == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (SLICES, resource_slice()),
        (CLASSES, device_class()),
        (CLAIMS, claim()),
        (TEMPLATES, template()),
    ],
)
async def test_generate_name_adds_five_characters_of_the_servers_alphabet(
    client: Client, path: str, body: Body
) -> None:
    body = copy.deepcopy(body)
    body["metadata"].pop("name", None)
    body["metadata"]["generateName"] = "gpushare-"
    names = {(await created(client, path, body))["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3
    for name in names:
        assert name.startswith("gpushare-") and len(name) == len("gpushare-") + 5
        assert set(name.removeprefix("gpushare-")) <= GENERATED


async def test_a_long_generate_name_is_cut_to_58_characters(client: Client) -> None:
    body = resource_slice()
    body["metadata"]["generateName"] = "x" * 70
    name = (await created(client, SLICES, body))["metadata"]["name"]
    assert name.startswith("x" * 58) and len(name) == 63


async def test_merge_and_json_patches_change_a_slice(client: Client) -> None:
    made = await created(client, SLICES, resource_slice())
    path = f"{SLICES}/{made['metadata']['name']}"
    labels = {"metadata": {"labels": {"gpushare.io/node": "n1"}}}
    reply = await client.call("PATCH", path, labels, content_type=MERGE_PATCH)
    assert reply.body["metadata"]["labels"] == {"gpushare.io/node": "n1"}
    assert reply.body["metadata"]["generation"] == 1  # metadata is no spec change
    ops = [{"op": "replace", "path": "/spec/pool/generation", "value": 2}]
    reply = await client.call("PATCH", path, ops, content_type=JSON_PATCH)
    assert reply.status == 200 and reply.body["spec"]["pool"]["generation"] == 2
    assert reply.body["metadata"]["generation"] == 2
    bad = [{"op": "replace", "path": "/spec/devices/0/capacity/memory/value", "value": "lots"}]
    failure(await client.call("PATCH", path, bad, content_type=JSON_PATCH), 400, "BadRequest")


# -- the status subresource ----------------------------------------------------------------


async def test_status_writes_change_only_status(client: Client) -> None:
    stored = await created(client, CLAIMS, claim())
    sent = copy.deepcopy(stored)
    sent["status"] = {"allocation": allocation()}
    sent["metadata"]["labels"] = {"ignored": "yes"}
    reply = await client.call("PUT", f"{CLAIMS}/c/status", sent)
    assert reply.status == 200, reply.body
    assert reply.body["status"]["allocation"] == allocation()
    assert "labels" not in reply.body["metadata"]
    assert reply.body["metadata"]["generation"] == 1

    patch = {"status": {"devices": [admitted()]}, "metadata": {"labels": {"no": "x"}}}
    reply = await client.call("PATCH", f"{CLAIMS}/c/status", patch, content_type=MERGE_PATCH)
    assert reply.status == 200, reply.body
    assert reply.body["status"]["devices"] == [admitted()]
    assert reply.body["status"]["allocation"] == allocation()
    assert "labels" not in reply.body["metadata"]
    got = await client.call("GET", f"{CLAIMS}/c/status")
    assert got.body == reply.body


async def test_main_resource_writes_leave_status_as_it_is(client: Client) -> None:
    stored = await allocated_claim(client)
    sent = copy.deepcopy(stored)
    sent["status"] = {}
    sent["metadata"]["labels"] = {"team": "a"}
    reply = await client.call("PUT", f"{CLAIMS}/c", sent)
    assert reply.status == 200, reply.body
    assert reply.body["metadata"]["labels"] == {"team": "a"}
    assert reply.body["status"] == stored["status"]
    patch = {"status": None, "metadata": {"labels": {"team": "b"}}}
    reply = await client.call("PATCH", f"{CLAIMS}/c", patch, content_type=MERGE_PATCH)
    assert reply.body["metadata"]["labels"] == {"team": "b"}
    assert reply.body["status"] == stored["status"]


@pytest.mark.parametrize("path", [CLAIMS, TEMPLATES])
async def test_a_claims_spec_is_immutable(client: Client, path: str) -> None:
    stored = await created(client, path, claim() if path == CLAIMS else template())
    name = stored["metadata"]["name"]
    spec = stored["spec"] if path == CLAIMS else stored["spec"]["spec"]
    spec["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "8Gi"
    body = failure(await client.call("PUT", f"{path}/{name}", stored), 422, "Invalid")
    assert cause(body, "spec", "FieldValueInvalid", "field is immutable")


# -- conflicts and preconditions -----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "suffix", "content_type"),
    [
        ("PUT", "", "application/json"),
        ("PUT", "/status", "application/json"),
        ("PATCH", "", MERGE_PATCH),
        ("PATCH", "/status", MERGE_PATCH),
    ],
)
async def test_a_stale_resource_version_is_a_conflict(
    client: Client, method: str, suffix: str, content_type: str
) -> None:
    stale = await allocated_claim(client)
    await client.call("PATCH", f"{CLAIMS}/c", {"metadata": {"labels": {"a": "1"}}},
                      content_type=MERGE_PATCH)  # fmt: skip
    stale["status"]["devices"] = [admitted()]
    reply = await client.call(method, f"{CLAIMS}/c{suffix}", stale, content_type=content_type)
    body = failure(reply, 409, "Conflict")
    assert body["message"] == (
        'Operation cannot be fulfilled on resourceclaims.resource.k8s.io "c": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )
    fresh = (await client.call("GET", f"{CLAIMS}/c")).body
    assert "devices" not in fresh["status"]


async def test_a_replace_without_a_resource_version_is_unconditional(client: Client) -> None:
    stored = await created(client, SLICES, resource_slice())
    name = stored["metadata"]["name"]
    del stored["metadata"]["resourceVersion"]
    stored["spec"]["pool"]["generation"] = 2
    reply = await client.call("PUT", f"{SLICES}/{name}", stored)
    assert reply.status == 200 and reply.body["spec"]["pool"]["generation"] == 2


@pytest.mark.parametrize(("key", "label"), [("uid", "UID"), ("resourceVersion", "ResourceVersion")])
async def test_delete_preconditions_that_do_not_hold_are_conflicts(
    client: Client, key: str, label: str
) -> None:
    stored = await created(client, SLICES, resource_slice())
    path = f"{SLICES}/{stored['metadata']['name']}"
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {key: "999"}}
    body = failure(await client.call("DELETE", path, options), 409, "Conflict")
    assert (
        f"Precondition failed: {label} in precondition: 999, {label} in object meta: "
        in (body["message"])
    )
    assert (await client.call("GET", path)).status == 200
    options["preconditions"] = {key: stored["metadata"][key]}
    assert (await client.call("DELETE", path, options)).status == 200
    assert (await client.call("GET", path)).status == 404


async def test_a_claim_with_a_finalizer_is_marked_then_deleted_when_it_is_gone(
    client: Client,
) -> None:
    finalizer = "resource.kubernetes.io/delete-protection"
    await created(client, CLAIMS, claim(finalizers=[finalizer]))
    reply = await client.call("DELETE", f"{CLAIMS}/c")
    assert reply.status == 200 and reply.body["metadata"]["deletionTimestamp"]
    assert (await client.call("GET", f"{CLAIMS}/c")).status == 200
    patch = {"metadata": {"finalizers": None}}
    await client.call("PATCH", f"{CLAIMS}/c", patch, content_type=MERGE_PATCH)
    assert (await client.call("GET", f"{CLAIMS}/c")).status == 404


async def test_a_collection_delete_removes_the_selected_slices(client: Client) -> None:
    for node in ("n1", "n1", "n2"):
        await created(client, SLICES, resource_slice(node))
    params = {"fieldSelector": f"spec.nodeName=n1,spec.driver={DRIVER}"}
    reply = await client.call("DELETE", SLICES, params=params)
    assert reply.status == 200 and reply.body["kind"] == "ResourceSliceList"
    assert [i["spec"]["nodeName"] for i in reply.body["items"]] == ["n1", "n1"]
    left = (await client.call("GET", SLICES)).body["items"]
    assert [i["spec"]["nodeName"] for i in left] == ["n2"]


# -- selectors and watches -----------------------------------------------------------------


async def test_slices_are_selected_by_node_and_driver(client: Client) -> None:
    await created(client, SLICES, resource_slice("n1"))
    await created(client, SLICES, resource_slice("n2"))
    other = resource_slice("n1")
    other["spec"]["driver"] = "gpu.example.com"
    await created(client, SLICES, other)

    async def nodes(selector: str) -> list[tuple[str, str]]:
        reply = await client.call("GET", SLICES, params={"fieldSelector": selector})
        assert reply.status == 200, reply.body
        return [(i["spec"]["nodeName"], i["spec"]["driver"]) for i in reply.body["items"]]

    assert sorted(await nodes("spec.nodeName=n1")) == [("n1", "gpu.example.com"), ("n1", DRIVER)]
    assert await nodes(f"spec.nodeName=n1,spec.driver={DRIVER}") == [("n1", DRIVER)]
    assert await nodes("spec.driver!=gpushare.io") == [("n1", "gpu.example.com")]
    reply = await client.call("GET", SLICES, params={"fieldSelector": "spec.pool.name=n1"})
    body = failure(reply, 400, "BadRequest")
    assert body["message"] == (
        "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: spec.pool.name"
    )
    reply = await client.call("GET", CLAIMS, params={"fieldSelector": "spec.nodeName=n1"})
    assert failure(reply, 400, "BadRequest")["message"] == (
        '"spec.nodeName" is not a known field selector: only "metadata.name", "metadata.namespace"'
    )


async def test_a_claim_watch_sees_creation_status_and_deletion(
    api: FakeApiServer, client: Client
) -> None:
    since = api.resource_version
    everywhere = asyncio.create_task(
        client.watch(ALL_CLAIMS, resourceVersion=since, timeoutSeconds="1")
    )
    namespaced = asyncio.create_task(
        client.watch(CLAIMS, resourceVersion=since, timeoutSeconds="1")
    )
    await asyncio.sleep(0.2)
    await allocated_claim(client)
    await created(client, f"{GROUP}/namespaces/team-b/resourceclaims", claim("b", "team-b"))
    await client.call("DELETE", f"{CLAIMS}/c")
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in await everywhere]
    assert seen == [("ADDED", "c"), ("MODIFIED", "c"), ("ADDED", "b"), ("DELETED", "c")]
    assert [e["type"] for e in await namespaced] == ["ADDED", "MODIFIED", "DELETED"]
    listed = await client.watch(ALL_CLAIMS, timeoutSeconds="1")
    assert [(e["type"], e["object"]["kind"]) for e in listed] == [("ADDED", "ResourceClaim")]


# -- test helpers, versions, quantities ----------------------------------------------------


async def test_put_object_stores_status_and_objects_lists_copies(api: FakeApiServer) -> None:
    allocated = {**claim(), "status": {"allocation": allocation(), "devices": [admitted()]}}
    put = api.put_object("resourceclaims", allocated)
    assert put["status"] == allocated["status"] and put["metadata"]["uid"]
    again = api.put_object("resourceclaims", {**allocated, "metadata": {"name": "c"}})
    assert again["metadata"]["namespace"] == "default"
    stored = api.objects("resourceclaims")
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in stored] == [
        ("default", "c"),
        (NS, "c"),
    ]
    stored[0]["status"] = {}
    assert api.objects("resourceclaims", NS)[0]["status"] == allocated["status"]
    assert (NS, "c") in api.objects["resourceclaims"]

    relabeled = copy.deepcopy(allocated)
    relabeled["metadata"]["labels"] = {"x": "1"}
    replaced = api.put_object("resourceclaims", relabeled)
    assert replaced["metadata"]["uid"] == put["metadata"]["uid"]
    assert replaced["metadata"]["labels"] == {"x": "1"}
    with pytest.raises(ApiError) as caught:
        api.put_object("resourceslices", resource_slice(devices=[gpu(), gpu()]))
    assert caught.value.code == 422
    put_slice = api.put_object("resourceslices", {**resource_slice(), "metadata": {"name": "s"}})
    assert "namespace" not in put_slice["metadata"]


def test_the_kube_version_names_installed_schemas() -> None:
    assert {"1.34", "1.35", "1.36", "1.37"} <= set(kube_versions())
    assert FakeApiServer().kube_version == "1.36"
    assert FakeApiServer(kube_version="v1.34.2").kube_version == "1.34"
    with pytest.raises(ValueError, match=r"1\.99"):
        FakeApiServer(kube_version="1.99")
