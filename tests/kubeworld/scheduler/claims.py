"""What the DRA scheduler stand-in reads and writes of pods and claims: API paths, owners and
annotations, a claim made from a template or for extended resources, reservations,
binding state, and its messages."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tests.kubeworld.quantity import Quantity

Obj = dict[str, Any]
SCHEDULER = "default-scheduler"
RESOURCE_API = "/apis/resource.k8s.io/v1"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
EXTENDED_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
MERGE_PATCH = "application/merge-patch+json"
UNBOUND = "spec.nodeName="
WRITE_TRIES = 5
LEFT_OUT = "node(s) left out after a failed binding"


@dataclass(frozen=True)
class ExtendedRequest:
    container: str
    resource: str
    request: str  # container-<i>-request-<j>
    device_class: str
    count: int


# -- claims --------------------------------------------------------------------------------


def claims_path(namespace: str) -> str:
    return f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"


def claim_path(claim: Obj) -> str:
    return f"{claims_path(claim['metadata']['namespace'])}/{claim['metadata']['name']}"


def pod_path(pod: Obj) -> str:
    meta = pod["metadata"]
    return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"


def pod_key(pod: Obj) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def uid_of(obj: Obj) -> str:
    return str(obj["metadata"].get("uid", ""))


def name_of(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def version_of(obj: Obj) -> int:
    return int(obj["metadata"].get("resourceVersion") or 0)


def annotation(obj: Obj, key: str) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get(key)


def allocation_of(claim: Obj) -> Obj | None:
    return (claim.get("status") or {}).get("allocation")


def results_of(claim: Obj) -> list[Obj]:
    return list(((allocation_of(claim) or {}).get("devices") or {}).get("results") or [])


def owned_by(claim: Obj, pod: Obj) -> bool:
    owners = claim["metadata"].get("ownerReferences") or []
    return any(o.get("uid") == pod["metadata"]["uid"] for o in owners)


def owner(pod: Obj) -> Obj:
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def claim_from_template(pod: Obj, claim_name: str, template: Obj) -> Obj:
    """What the resourceclaim controller creates for a pod's template claim."""
    template_meta = (template.get("spec") or {}).get("metadata") or {}
    annotations = {**(template_meta.get("annotations") or {}), POD_CLAIM_ANNOTATION: claim_name}
    metadata: Obj = {
        "generateName": f"{pod['metadata']['name']}-{claim_name}-",
        "namespace": pod["metadata"]["namespace"],
        "ownerReferences": [owner(pod)],
        "annotations": annotations,
    }
    if labels := template_meta.get("labels"):
        metadata["labels"] = dict(labels)
    spec = json.loads(json.dumps(template["spec"]["spec"]))
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": spec,
    }


def extended_requests(pod: Obj, classes: list[Obj]) -> list[ExtendedRequest]:
    """KEP-5004: one request per container and extended resource a DeviceClass maps."""
    mapped = extended_names(classes)
    spec = pod["spec"]
    found = []
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    for index, container in enumerate(containers):
        resources = container.get("resources") or {}
        amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        wanted = [
            (n, Quantity.parse(str(amounts[n])).value()) for n in sorted(amounts) if n in mapped
        ]
        found += [
            ExtendedRequest(
                container["name"], name, f"container-{index}-request-{j}", mapped[name], count
            )
            for j, (name, count) in enumerate(wanted)
            if count > 0
        ]
    return found


def extended_names(classes: list[Obj]) -> dict[str, str]:
    """Extended resource name -> DeviceClass: each class's implicit name, and its explicit
    one (the newest class wins; at the same time, the first name)."""
    mapped = {f"{IMPLICIT_PREFIX}{c['metadata']['name']}": c["metadata"]["name"] for c in classes}
    ordered = sorted(classes, key=lambda c: c["metadata"]["name"])
    ordered.sort(key=lambda c: c["metadata"].get("creationTimestamp", ""), reverse=True)
    for device_class in reversed(ordered):
        if name := (device_class.get("spec") or {}).get("extendedResourceName"):
            mapped[name] = device_class["metadata"]["name"]
    return mapped


def extended_claim(pod: Obj, extended: list[ExtendedRequest]) -> Obj:
    requests = [
        {
            "name": e.request,
            "exactly": {
                "deviceClassName": e.device_class,
                "allocationMode": "ExactCount",
                "count": e.count,
            },
        }
        for e in extended
    ]
    metadata = {
        "generateName": f"{pod['metadata']['name']}-extended-resources-",
        "namespace": pod["metadata"]["namespace"],
        "ownerReferences": [owner(pod)],
        "annotations": {EXTENDED_ANNOTATION: "true"},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": requests}},
    }


def reserve(claim: Obj, allocation: Obj | None, pod: Obj) -> Obj:
    """``claim`` with ``allocation`` and the pod in ``reservedFor``."""
    meta = pod["metadata"]
    status = dict(claim.get("status") or {})
    status["allocation"] = allocation
    reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") != meta["uid"]]
    status["reservedFor"] = [
        *reserved,
        {"resource": "pods", "name": meta["name"], "uid": meta["uid"]},
    ]
    return {**claim, "status": status}


def allows_node(allocation: Obj | None, node: str) -> bool:
    """Whether an allocation's node selector (matchFields on metadata.name) admits ``node``."""
    terms = ((allocation or {}).get("nodeSelector") or {}).get("nodeSelectorTerms")
    if not terms:
        return True
    return any(
        all(
            f.get("key") != "metadata.name"
            or (node in f.get("values", [])) == (f.get("operator") == "In")
            for f in term.get("matchFields") or []
        )
        for term in terms
    )


def binding_state(claim: Obj) -> str:
    """``ready``, ``pending``, or the failure message, for the results with binding
    conditions (the first not ready decides, as kube-scheduler's check)."""
    entries = (claim.get("status") or {}).get("devices") or []
    for result in results_of(claim):
        if not result.get("bindingConditions"):
            continue
        entry = next((e for e in entries if same_device(e, result)), None)
        if entry is None:
            return "pending"
        conditions = {c.get("type"): c for c in entry.get("conditions") or []}
        for name in result.get("bindingFailureConditions") or []:
            if (c := conditions.get(name)) and c.get("status") == "True":
                return (
                    f"binding failed: reason={c.get('reason', '')}, message={c.get('message', '')}"
                )
        if any(
            (conditions.get(n) or {}).get("status") != "True" for n in result["bindingConditions"]
        ):
            return "pending"
    return "ready"


def same_device(entry: Obj, result: Obj) -> bool:
    keys = ("driver", "pool", "device", *(("shareID",) if result.get("shareID") else ()))
    return all(entry.get(k) == result.get(k) for k in keys)


def binding(pod: Obj, node: str) -> Obj:
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def mine(pod: Obj) -> bool:
    """A pod of the default scheduler that may use DRA (claims, or an extended resource)."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName", SCHEDULER) not in (SCHEDULER, "") or spec.get("nodeName"):
        return False
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    extended = any(
        "/" in name
        for c in containers
        for part in ("limits", "requests")
        for name in ((c.get("resources") or {}).get(part) or {})
    )
    return bool(spec.get("resourceClaims")) or extended


def unavailable(total: int, reasons: dict[str, str]) -> str:
    """kube-scheduler's wording: the count of nodes per distinct reason."""
    counts = Counter(reasons.values())
    parts = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    return (
        f"0/{total} nodes are available: {parts}." if parts else f"0/{total} nodes are available."
    )


@contextlib.asynccontextmanager
async def _tasks() -> AsyncIterator[Callable[[Coroutine[Any, Any, None]], None]]:
    running: set[asyncio.Task[None]] = set()

    def spawn(coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        running.add(task)
        task.add_done_callback(running.discard)

    try:
        yield spawn
    finally:
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
