"""The stand-in API server's resource.k8s.io/v1: the verbs, the status subresource, generated
names, preconditions, selectors, watches, and the real server's decoding (400) and
validation (422) of what a DRA driver and a scheduler write. Driven over plain HTTP."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Callable
from fractions import Fraction
from typing import Any, NamedTuple

import aiohttp
import pytest

from tests.kube.apiserver import (
    JSON_PATCH,
    MERGE_PATCH,
    ApiError,
    FakeApiServer,
    kube_versions,
)
from tests.kube.quantity import QuantityError, integer_value, parse_quantity

NS = "team-a"
DRIVER = "gpushare.io"
GROUP = "/apis/resource.k8s.io/v1"
CLASSES = f"{GROUP}/deviceclasses"
SLICES = f"{GROUP}/resourceslices"
CLAIMS = f"{GROUP}/namespaces/{NS}/resourceclaims"
ALL_CLAIMS = f"{GROUP}/resourceclaims"
TEMPLATES = f"{GROUP}/namespaces/{NS}/resourceclaimtemplates"
SHARE = "5f1c2a9e-3b4d-4c6e-8f70-1a2b3c4d5e6f"
WHEN = "2026-01-01T00:00:00Z"
GENERATED = set("bcdfghjklmnpqrstvwxz2456789")
Body = dict[str, Any]


class Reply(NamedTuple):
    status: int
    body: Any
    warnings: list[str]


class Client:
    """A bare HTTP client of the stand-in."""

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
    ) -> Reply:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(
            method, self.url + path, data=data, headers=headers, params=params
        ) as response:
            found = await response.json(content_type=None)
            return Reply(response.status, found, response.headers.getall("Warning", []))

    async def watch(self, path: str, **params: str) -> list[Body]:
        """Every event of one watch until the server ends it."""
        async with self.session.get(self.url + path, params={"watch": "1", **params}) as reply:
            assert reply.status == 200
            return [json.loads(line) async for line in reply.content if line.strip()]


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(history=100) as server:
        yield server


@pytest.fixture
async def client(api: FakeApiServer) -> AsyncIterator[Client]:
    async with aiohttp.ClientSession() as session:
        yield Client(session, api.url)


def failure(reply: Reply, code: int, reason: str) -> Body:
    """The reply's Status body, once it is the failure expected."""
    body = reply.body
    assert (reply.status, body.get("kind"), body.get("status")) == (code, "Status", "Failure"), body
    assert (body["code"], body["reason"]) == (code, reason), body
    return dict(body)


def cause(body: Body, field: str, reason: str, words: str = "") -> Body:
    """The ``details.causes`` entry of a 422 about ``field``."""
    found = [c for c in body["details"]["causes"] if c["field"] == field and c["reason"] == reason]
    assert found, body["details"]["causes"]
    assert words in found[0]["message"], found[0]
    assert f"{field}: {found[0]['message']}" in body["message"]
    return dict(found[0])


# -- objects as the driver and the scheduler write them ------------------------------------


def gpu(name: str = "gpu-0", **extra: Any) -> Body:
    """A shared GPU as the driver publishes it."""
    device: Body = {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {
            "uuid": {"string": f"GPU-{name}"},
            "index": {"int": 0},
            "computeCapability": {"version": "9.0.0"},
            "protected": {"bool": False},
        },
        "capacity": {
            "memory": {
                "value": "80Gi",
                "requestPolicy": {
                    "default": "8Gi",
                    "validRange": {"min": "256Mi", "max": "80Gi", "step": "1Mi"},
                },
            },
            "threads": {
                "value": "200",
                "requestPolicy": {
                    "default": "25",
                    "validRange": {"min": "1", "max": "100", "step": "1"},
                },
            },
            "clients": {"value": "16", "requestPolicy": {"default": "1", "validValues": ["1"]}},
        },
        "bindingConditions": ["gpushare.io/admitted"],
        "bindingFailureConditions": ["gpushare.io/refused"],
        "bindsToNode": True,
    }
    return {**device, **extra}


TAINT = {"key": "gpushare.io/drained", "value": "true", "effect": "NoSchedule", "timeAdded": WHEN}


def resource_slice(node: str = "n1", devices: list[Body] | None = None, **spec: Any) -> Body:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"00000-{DRIVER}-{node}-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [gpu()] if devices is None else devices,
            **spec,
        },
    }


def device_class(name: str = DRIVER) -> Body:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim_spec(memory: str = "4Gi") -> Body:
    exactly = {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}}}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def claim(name: str = "c", namespace: str = NS, **meta: Any) -> Body:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": claim_spec(),
    }


def template(name: str = "t") -> Body:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": claim_spec()},
    }


def allocation(device: str = "gpu-0") -> Body:
    """What the scheduler writes to a claim's status: one share of ``device`` on n1."""
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "n1",
        "device": device,
        "shareID": SHARE,
        "consumedCapacity": {"memory": "4Gi", "threads": "25", "clients": "1"},
        "bindingConditions": ["gpushare.io/admitted"],
        "bindingFailureConditions": ["gpushare.io/refused"],
    }
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    return {
        "devices": {"results": [result]},
        "nodeSelector": {"nodeSelectorTerms": [term]},
        "allocationTimestamp": WHEN,
    }


def condition(kind: str = "gpushare.io/admitted", reason: str = "Admitted") -> Body:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": "lease L1",
        "lastTransitionTime": WHEN,
    }


def admitted(device: str = "gpu-0", share: str = SHARE) -> Body:
    """What the agent writes to a claim's status.devices."""
    entry = {"driver": DRIVER, "pool": "n1", "device": device, "shareID": share}
    return {**entry, "conditions": [condition()]}


async def created(client: Client, path: str, body: Body) -> Body:
    reply = await client.call("POST", path, body)
    assert reply.status == 201, reply.body
    return dict(reply.body)


async def allocated_claim(client: Client, name: str = "c") -> Body:
    """A claim the scheduler allocated (through ``/status``)."""
    stored = await created(client, CLAIMS, claim(name))
    stored["status"] = {"allocation": allocation()}
    reply = await client.call("PUT", f"{CLAIMS}/{name}/status", stored)
    assert reply.status == 200, reply.body
    return dict(reply.body)


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


# -- decoding: 400 -------------------------------------------------------------------------


def _set(path: str, value: Any) -> Callable[[Body], None]:
    """A change of a slice: ``value`` at the dotted ``path`` (digits index lists)."""

    def change(body: Body) -> None:
        *parents, last = path.split(".")
        node: Any = body
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return change


def _drop(path: str) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        *parents, last = path.split(".")
        node: Any = body
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]

    return change


MEMORY = "spec.devices.0.capacity.memory"
THREADS = "spec.devices.0.capacity.threads"
CLIENTS = "spec.devices.0.capacity.clients"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            _set("spec.pool.generation", "one"),
            "json: cannot unmarshal string into Go struct field spec.pool.generation",
        ),
        (_set(f"{MEMORY}.value", "lots"), "quantities must match the regular expression"),
        (_set(f"{MEMORY}.value", True), "cannot unmarshal bool"),
        (_set("spec.devices.0.taints", [{**TAINT, "timeAdded": "yesterday"}]), "parsing time"),
        (
            _set("spec.devices.0.colour", "blue"),
            'strict decoding error: unknown field "spec.devices[0].colour"',
        ),
    ],
    ids=["wrong type", "quantity", "bool quantity", "time", "unknown field"],
)
async def test_what_does_not_decode_is_a_bad_request(
    client: Client, change: Callable[[Body], None], words: str
) -> None:
    body = resource_slice()
    change(body)
    reply = await client.call("POST", SLICES, body)
    assert words in failure(reply, 400, "BadRequest")["message"]
    assert (await client.call("GET", SLICES)).body["items"] == []


@pytest.mark.parametrize("mode", ["Warn", "Ignore"])
async def test_unknown_fields_are_dropped_when_the_request_says_so(
    client: Client, mode: str
) -> None:
    body = resource_slice(devices=[gpu(colour="blue")])
    reply = await client.call("POST", SLICES, body, params={"fieldValidation": mode})
    assert reply.status == 201
    assert "colour" not in reply.body["spec"]["devices"][0]
    warned = ['299 - "unknown field \\"spec.devices[0].colour\\""']
    assert reply.warnings == (warned if mode == "Warn" else [])


async def test_the_servers_default_field_validation_is_a_setting() -> None:
    async with FakeApiServer(field_validation="Warn") as api, aiohttp.ClientSession() as s:
        reply = await Client(s, api.url).call("POST", CLASSES, {**device_class(), "x": 1})
        assert reply.status == 201 and len(reply.warnings) == 1
        reply = await Client(s, api.url).call(
            "POST", CLASSES, {**device_class("b"), "x": 1}, params={"fieldValidation": "Strict"}
        )
        failure(reply, 400, "BadRequest")
    with pytest.raises(ValueError, match="field_validation"):
        FakeApiServer(field_validation="Loose")


# -- validation: 422 -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (_drop("spec.driver"), "spec.driver"),
        (_drop("spec.pool.generation"), "spec.pool.generation"),
        (_drop("spec.devices.0.name"), "spec.devices[0].name"),
        (_drop(f"{MEMORY}.value"), "spec.devices[0].capacity[memory].value"),
    ],
)
async def test_a_missing_required_field_is_invalid(
    client: Client, change: Callable[[Body], None], field: str
) -> None:
    body = resource_slice()
    change(body)
    reply = failure(await client.call("POST", SLICES, body), 422, "Invalid")
    assert reply["message"].startswith('ResourceSlice.resource.k8s.io "00000-gpushare.io-n1-')
    assert reply["details"]["kind"] == "ResourceSlice"
    assert reply["details"]["group"] == "resource.k8s.io"
    assert cause(reply, field, "FieldValueRequired")["message"] == "Required value"


def _devices(count: int, tainted: bool = False) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        body["spec"]["devices"] = [gpu(f"gpu-{i}") for i in range(count)]
        if tainted:
            body["spec"]["devices"][0]["taints"] = [TAINT]

    return change


def _rule_ids(rules: list[tuple[Any, tuple[str, str], str]]) -> list[str]:
    """``spec.devices[0].bindingConditions FieldValueTooMany``: a rule's field and cause."""
    return [" ".join(where) for _, where, _ in rules]


RANGE = f"{MEMORY}.requestPolicy.validRange"
AT = "spec.devices[0]"
MEMORY_AT = f"{AT}.capacity[memory].requestPolicy"
SLICE_RULES = [
    (
        _drop("spec.devices.0.allowMultipleAllocations"),
        (f"{AT}.capacity[memory].requestPolicy", "FieldValueForbidden"),
        "allowMultipleAllocations must be true",
    ),
    (
        _set(f"{RANGE}.min", "16Gi"),
        (f"{MEMORY_AT}.validRange.min", "FieldValueInvalid"),
        'Invalid value: "8Gi": default is less than min: 16Gi',
    ),
    (_set(f"{RANGE}.min", "-1Mi"), (f"{MEMORY_AT}.validRange.min", "FieldValueInvalid"),
     "must be greater than or equal to zero"),
    (_set(f"{RANGE}.max", "4Gi"), (f"{MEMORY_AT}.validRange.max", "FieldValueInvalid"),
     "default is more than max: 4Gi"),
    (_set(f"{RANGE}.max", "81Gi"), (f"{MEMORY_AT}.validRange.max", "FieldValueInvalid"),
     "max is larger than capacity value: 80Gi"),
    (_set(f"{THREADS}.requestPolicy.validRange.min", "300"),
     (f"{AT}.capacity[threads].requestPolicy.validRange.min", "FieldValueInvalid"),
     "min is larger than capacity value: 200"),
    (_set(f"{MEMORY}.requestPolicy.default", "300000Ki"),
     (f"{MEMORY_AT}.validRange.step", "FieldValueInvalid"),
     "value is not a multiple of a given step (1Mi) from (256Mi)"),
    (_set(f"{THREADS}.requestPolicy.validRange.step", "200"),
     (f"{AT}.capacity[threads].requestPolicy.validRange.step", "FieldValueInvalid"),
     "one step 201 is larger than capacity value: 200"),
    (_drop(f"{MEMORY}.requestPolicy.default"), (f"{MEMORY_AT}.default", "FieldValueRequired"),
     "required when validRange is defined"),
    (_set(f"{CLIENTS}.requestPolicy.validValues", [str(n) for n in range(1, 12)]),
     (f"{AT}.capacity[clients].requestPolicy.validValues", "FieldValueTooMany"),
     "Too many: 11: must have at most 10 items"),
    (_set(f"{CLIENTS}.requestPolicy.validValues", ["1", "4", "2"]),
     (f"{AT}.capacity[clients].requestPolicy.validValues[2]", "FieldValueInvalid"),
     "values must be sorted in ascending order"),
    (_set(f"{CLIENTS}.requestPolicy.validValues", ["2", "4"]),
     (f"{AT}.capacity[clients].requestPolicy.validValues", "FieldValueInvalid"),
     "default value is not valid according to the requestPolicy"),
    (_set(f"{CLIENTS}.requestPolicy.validValues", ["1", "32"]),
     (f"{AT}.capacity[clients].requestPolicy.validValues[1]", "FieldValueInvalid"),
     "option is larger than capacity value: 16"),
    (_set(f"{CLIENTS}.requestPolicy.validValues", ["1", "1"]),
     (f"{AT}.capacity[clients].requestPolicy.validValues[1]", "FieldValueDuplicate"),
     'Duplicate value: "1"'),
    (_set(f"{CLIENTS}.requestPolicy.validRange", {"min": "1"}),
     (f"{AT}.capacity[clients].requestPolicy", "FieldValueForbidden"),
     'cannot specify "validValues" and "validRange" at the same time'),
    (_set("spec.devices.0.bindingConditions", [f"gpushare.io/c{i}" for i in range(5)]),
     (f"{AT}.bindingConditions", "FieldValueTooMany"), "must have at most 4 items"),
    (_set("spec.devices.0.bindingFailureConditions", [f"gpushare.io/f{i}" for i in range(5)]),
     (f"{AT}.bindingFailureConditions", "FieldValueTooMany"), "must have at most 4 items"),
    (_drop("spec.devices.0.bindingFailureConditions"),
     (f"{AT}.bindingFailureConditions", "FieldValueInvalid"),
     "bindingFailureConditions are required to use bindingConditions"),
    (_set("spec.devices.0.bindingFailureConditions", ["gpushare.io/admitted"]),
     (f"{AT}.bindingFailureConditions[0]", "FieldValueInvalid"),
     "must not overlap with bindingConditions"),
    (_set("spec.devices.0.bindingConditions", ["not a name!"]),
     (f"{AT}.bindingConditions[0]", "FieldValueInvalid"), "name part must consist of"),
    (_devices(129), ("spec.devices", "FieldValueTooMany"), "Too many: 129: must have at most 128"),
    (_devices(65, tainted=True), ("spec.devices", "FieldValueTooMany"),
     "Too many: 65: must have at most 64 items"),
    (_set("spec.devices", [gpu(), gpu()]), ("spec.devices[1]", "FieldValueDuplicate"),
     'Duplicate value: "gpu-0"'),
    (_set("spec.devices.0.taints", [{**TAINT, "effect": "PreferNoSchedule"}]),
     (f"{AT}.taints[0].effect", "FieldValueNotSupported"),
     'supported values: "NoExecute", "NoSchedule", "None"'),
    (_set("spec.devices.0.taints", [TAINT] * 17), (f"{AT}.taints", "FieldValueTooMany"),
     "must have at most 16 items"),
    (_set("spec.devices.0.attributes", {f"a{i}": {"int": i} for i in range(30)}),
     (AT, "FieldValueInvalid"), "the total number of attributes and capacities must not exceed 32"),
    (_drop("spec.nodeName"), ("spec", "FieldValueRequired"), "exactly one of `nodeName`"),
    (_set("spec.allNodes", True), ("spec", "FieldValueInvalid"),
     'Invalid value: "{`nodeName`, `allNodes`}"'),
    (_set("spec.pool.resourceSliceCount", 0),
     ("spec.pool.resourceSliceCount", "FieldValueInvalid"), "must be greater than zero"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "where", "words"), SLICE_RULES, ids=_rule_ids(SLICE_RULES))
async def test_a_slice_that_breaks_a_rule_of_the_server_is_invalid(
    client: Client, change: Callable[[Body], None], where: tuple[str, str], words: str
) -> None:
    body = resource_slice()
    change(body)
    reply = failure(await client.call("POST", SLICES, body), 422, "Invalid")
    assert cause(reply, *where, words)
    assert (await client.call("GET", SLICES)).body["items"] == []


@pytest.mark.parametrize("version", kube_versions())
async def test_the_drivers_slice_is_valid_in_every_installed_version(version: str) -> None:
    full = resource_slice(devices=[gpu(f"gpu-{i}", taints=[TAINT]) for i in range(64)])
    untainted = resource_slice(devices=[gpu(f"gpu-{i}") for i in range(128)])
    async with FakeApiServer(kube_version=version) as api, aiohttp.ClientSession() as s:
        for body in (full, untainted):
            reply = await Client(s, api.url).call("POST", SLICES, body)
            assert reply.status == 201, reply.body


@pytest.mark.parametrize(
    ("field", "value"),
    [("spec.driver", "gpu.example.com"), ("spec.nodeName", "n2"), ("spec.pool.name", "n2")],
)
async def test_a_slices_driver_node_and_pool_are_immutable(
    client: Client, field: str, value: str
) -> None:
    stored = await created(client, SLICES, resource_slice())
    _set(field, value)(stored)
    reply = await client.call("PUT", f"{SLICES}/{stored['metadata']['name']}", stored)
    assert cause(failure(reply, 422, "Invalid"), field, "FieldValueInvalid", "field is immutable")


def _status(change: Callable[[Body], None]) -> Body:
    status = {"allocation": allocation(), "devices": [admitted()]}
    change(status)
    return status


CONDITION = "devices.0.conditions.0"
ENTRY = "status.devices[0]"
STATUS_RULES = [
    (_set("devices.0.device", "gpu-1"), (ENTRY, "FieldValueInvalid"),
     f'"{DRIVER}/n1/gpu-1/{SHARE}": must be an allocated device in the claim'),
    (_set("devices.0.shareID", "0b6e1c0e-0000-4000-8000-000000000000"),
     (ENTRY, "FieldValueInvalid"), "must be an allocated device in the claim"),
    (_set("devices", [admitted(), admitted()]), ("status.devices[1]", "FieldValueDuplicate"),
     "Duplicate value"),
    (_set("devices.0.conditions", [condition(f"gpushare.io/c{i}") for i in range(9)]),
     (f"{ENTRY}.conditions", "FieldValueTooMany"), "Too many: 9: must have at most 8 items"),
    (_set(f"{CONDITION}.reason", "Refused because"),
     (f"{ENTRY}.conditions[0].reason", "FieldValueInvalid"),
     "a condition reason must start with alphabetic character"),
    (_set(f"{CONDITION}.status", "Maybe"),
     (f"{ENTRY}.conditions[0].status", "FieldValueNotSupported"),
     'supported values: "False", "True", "Unknown"'),
    (_set("devices.0.conditions", [condition(), condition()]),
     (f"{ENTRY}.conditions[1].type", "FieldValueDuplicate"), '"gpushare.io/admitted"'),
    (_drop(f"{CONDITION}.lastTransitionTime"),
     (f"{ENTRY}.conditions[0].lastTransitionTime", "FieldValueRequired"), "must be set"),
    (_set(f"{CONDITION}.reason", ""), (f"{ENTRY}.conditions[0].reason", "FieldValueRequired"),
     "must be set"),
    (_set("allocation.devices.results.0.bindingConditions", [f"a/c{i}" for i in range(5)]),
     ("status.allocation.devices.results[0].bindingConditions", "FieldValueTooMany"),
     "must have at most 4 items"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "where", "words"), STATUS_RULES, ids=_rule_ids(STATUS_RULES))
async def test_a_claim_status_that_breaks_a_rule_of_the_server_is_invalid(
    client: Client, change: Callable[[Body], None], where: tuple[str, str], words: str
) -> None:
    stored = await created(client, CLAIMS, claim())
    stored["status"] = _status(change)
    reply = failure(await client.call("PUT", f"{CLAIMS}/c/status", stored), 422, "Invalid")
    assert reply["message"].startswith('ResourceClaim.resource.k8s.io "c" is invalid: ')
    assert cause(reply, *where, words)
    assert (await client.call("GET", f"{CLAIMS}/c")).body["status"] == {}


async def test_the_agents_status_writes_are_valid(client: Client) -> None:
    stored = await allocated_claim(client)
    refused = condition("gpushare.io/refused", "Refused_MEMORY_EXHAUSTED")
    stored["status"]["devices"] = [{**admitted(), "conditions": [refused]}]
    reply = await client.call("PUT", f"{CLAIMS}/c/status", stored)
    assert reply.status == 200, reply.body


async def test_an_allocation_is_immutable_once_set_but_may_be_cleared(client: Client) -> None:
    stored = await allocated_claim(client)
    stored["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"
    reply = await client.call("PUT", f"{CLAIMS}/c/status", stored)
    assert cause(failure(reply, 422, "Invalid"), "status.allocation", "FieldValueInvalid")
    patch = {"status": {"allocation": None}}
    reply = await client.call("PATCH", f"{CLAIMS}/c/status", patch, content_type=MERGE_PATCH)
    assert reply.status == 200 and reply.body["status"] == {}


async def test_reserved_for_needs_an_allocation(client: Client) -> None:
    await created(client, CLAIMS, claim())
    user = {"resource": "pods", "name": "p", "uid": "u1"}
    patch = {"status": {"reservedFor": [user]}}
    reply = await client.call("PATCH", f"{CLAIMS}/c/status", patch, content_type=MERGE_PATCH)
    assert cause(failure(reply, 422, "Invalid"), "status.reservedFor", "FieldValueForbidden")


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


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * 2**30),
        ("256Mi", 256 * 2**20),
        ("1Ki", 1024),
        ("1.5G", 1_500_000_000),
        ("2k", 2000),
        ("100m", Fraction(1, 10)),
        ("5u", Fraction(5, 10**6)),
        ("1e3", 1000),
        ("25E-1", Fraction(5, 2)),
        ("1E", 10**18),
        (".5", Fraction(1, 2)),
        ("-1Mi", -(2**20)),
        (16, 16),
        (None, 0),
    ],
)
def test_quantities_are_read_exactly(text: Any, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1Qi", "Gi", "1K", "1.2.3", "1 Gi", "1e", True, [1]])
def test_what_is_no_quantity_is_refused(text: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_a_quantitys_value_rounds_away_from_zero() -> None:
    assert integer_value(Fraction(1, 10)) == 1
    assert integer_value(Fraction(-1, 10)) == -1
    assert integer_value(Fraction(4)) == 4
