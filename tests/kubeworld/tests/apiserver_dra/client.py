"""A bare HTTP client of the API stand-in's resource.k8s.io/v1 (the status, body and
``Warning`` headers of a reply), the checks of its failures, and the objects a DRA driver and
a scheduler write, as its tests send them."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import aiohttp

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
