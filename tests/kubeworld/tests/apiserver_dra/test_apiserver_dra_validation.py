"""The stand-in API server decodes (400) and validates (422) a resource.k8s.io/v1 write as
the real server does: wrong types, quantities and times that do not parse, unknown fields
under each ``fieldValidation``; every rule past the schema, each cause naming its field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.kubeworld.apiserver import (
    MERGE_PATCH,
    FakeApiServer,
    kube_versions,
)
from tests.kubeworld.tests.apiserver_dra.client import (
    CLAIMS,
    CLASSES,
    DRIVER,
    SHARE,
    SLICES,
    TAINT,
    Body,
    Client,
    admitted,
    allocated_claim,
    allocation,
    cause,
    claim,
    condition,
    created,
    device_class,
    failure,
    gpu,
    resource_slice,
)

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
