"""Builders of resource.k8s.io/v1 objects, as the API returns them, for the DRA stand-ins'
tests: devices with gpushare.io's capacities, slices, classes, claims and requests; the
driver, node and API token those tests share (tests/dra/conftest.py's ``api``); ``kube``,
the REST client over the conftest's ``api`` (a fixture the conftests import), and the
settings that make an agent a node's DRA driver."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent.kubeapi.rest import RestKubeApi
from tests.certs import make_token

if TYPE_CHECKING:
    from tests.kubeworld.apiserver import FakeApiServer

Obj = dict[str, Any]
DRIVER = "gpushare.io"
NODE = "node-a"
TOKEN = "t"  # the API stand-in's bearer token
API = "resource.k8s.io/v1"


@pytest.fixture
async def kube(api: FakeApiServer, kube_timeout_s: float) -> AsyncIterator[RestKubeApi]:
    """The REST client over ``api``, waiting ``kube_timeout_s`` for an answer (both the
    conftest's fixtures)."""
    async with RestKubeApi.from_url(api.url, token=TOKEN, timeout_s=kube_timeout_s) as adapter:
        yield adapter


def driver_overrides(root: Path, api_url: str, *, token: str = TOKEN) -> dict[str, object]:
    """Settings that make an agent the DRA driver of node ``NODE``, publishing to the API
    at ``api_url`` with ``token``, whose file is written under ``root``."""
    make_token(root / "api-token", token)
    return {
        "runtime.node_name": NODE,
        "dra.enabled": True,
        "dra.plugin_dir": str(root / "plugin"),
        "dra.registry_dir": str(root / "registry"),
        "dra.cdi_dir": str(root / "cdi"),
        "dra.api_server": api_url,
        "dra.api_token_file": str(root / "api-token"),
    }


def memory(value: str = "80Gi", *, default: str | None = "1Gi", step: str = "1Gi") -> Obj:
    entry: Obj = {"value": value}
    if default is not None:
        policy = {"default": default, "validRange": {"min": "1Gi", "max": value, "step": step}}
        entry["requestPolicy"] = policy
    return entry


def threads(value: str = "100", valid: Sequence[str] = ("10", "25", "50", "100")) -> Obj:
    return {"value": value, "requestPolicy": {"default": valid[0], "validValues": list(valid)}}


def device(
    name: str,
    *,
    capacity: Mapping[str, Obj] | None = None,
    multiple: bool = True,
    attributes: Mapping[str, Obj] | None = None,
    taints: Iterable[Obj] = (),
    binding: bool = False,
    **extra: Any,
) -> Obj:
    """A device with ``memory`` and ``threads`` unless ``capacity`` says otherwise; its
    ``index`` attribute is its name's last number."""
    found: Obj = {
        "name": name,
        "attributes": dict(attributes or {"index": {"int": int(name.rsplit("-", 1)[-1])}}),
        "capacity": dict(
            capacity if capacity is not None else {"memory": memory(), "threads": threads()}
        ),
    }
    if multiple:
        found["allowMultipleAllocations"] = True
    if taints := list(taints):
        found["taints"] = taints
    if binding:
        found.update(
            bindingConditions=["gpushare.io/admitted"],
            bindingFailureConditions=["gpushare.io/refused"],
            bindsToNode=True,
        )
    return found | extra


def resource_slice(
    devices: Sequence[Obj],
    *,
    node: str = NODE,
    name: str = "",
    generation: int = 1,
    count: int = 1,
    pool: str = "",
    **spec: Any,
) -> Obj:
    return {
        "apiVersion": API,
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"00000-{DRIVER}-{node}-abcde"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
            "devices": list(devices),
            **spec,
        },
    }


def device_class(
    name: str = DRIVER,
    *,
    selectors: Sequence[str] = (f'device.driver == "{DRIVER}"',),
    config: Sequence[Obj] = (),
    extended: str = "",
) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": e}} for e in selectors]}
    if config:
        spec["config"] = list(config)
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": API, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def request(
    name: str = "gpu",
    *,
    count: int = 1,
    capacity: Mapping[str, str] | None = None,
    tolerations: Sequence[Obj] = (),
    selectors: Sequence[str] = (),
    all_devices: bool = False,
    class_name: str = DRIVER,
) -> Obj:
    exactly: Obj = {"deviceClassName": class_name}
    if all_devices:
        exactly["allocationMode"] = "All"
    else:
        exactly.update(allocationMode="ExactCount", count=count)
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    if tolerations:
        exactly["tolerations"] = list(tolerations)
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": exactly}


def claim(
    *requests: Obj,
    name: str = "train",
    namespace: str = "team-a",
    constraints: Sequence[Obj] = (),
    config: Sequence[Obj] = (),
) -> Obj:
    devices: Obj = {"requests": list(requests or [request()])}
    if constraints:
        devices["constraints"] = list(constraints)
    if config:
        devices["config"] = list(config)
    return {
        "apiVersion": API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
        "spec": {"devices": devices},
    }


def allocated_claim(*results: Obj, name: str = "earlier") -> Obj:
    """A claim allocated before, with these results (``driver`` and ``pool`` filled in)."""
    found = claim(name=name)
    full = [{"request": "gpu", "driver": DRIVER, "pool": NODE, **r} for r in results]
    found["status"] = {"allocation": {"devices": {"results": full}}}
    return found


def share(device_name: str, **consumed: str) -> Obj:
    """An existing shared result on ``device_name``."""
    return {"device": device_name, "shareID": str(uuid.uuid4()), "consumedCapacity": consumed}


def claim_user_pod(
    api: FakeApiServer, claim: Obj, name: str, run_as_user: int | None = 1000
) -> Obj:
    """A pod in the API stand-in whose container uses ``claim`` (by its name), running as
    ``run_as_user`` (pod-level; None: not said)."""
    meta = claim["metadata"]
    spec: Obj = {
        "resourceClaims": [{"name": "gpu", "resourceClaimName": meta["name"]}],
        "containers": [
            {"name": "main", "image": "app", "resources": {"claims": [{"name": "gpu"}]}}
        ],
    }
    if run_as_user is not None:
        spec["securityContext"] = {"runAsUser": run_as_user}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": meta["namespace"]},
        "spec": spec,
    }
    return api.put_object("pods", pod)


def reserve(claim: Obj, *pods: Obj) -> Obj:
    """``claim`` reserved for ``pods`` (its ``status.reservedFor``, added to)."""
    refs = claim["status"].setdefault("reservedFor", [])
    for pod in pods:
        refs.append(
            {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        )
    return claim
