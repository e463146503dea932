"""A stand-in kube-apiserver for tests: real paths, JSON shapes, status codes and ``Status``
error bodies for the few resources the cluster side uses (pods, nodes, core/v1 events,
discovery/v1 EndpointSlices, coordination/v1 Leases: create, get and PUT; apps/v1
DaemonSets: get, list and delete; every verb of resource.k8s.io/v1 DeviceClasses, ResourceSlices,
ResourceClaims with ``/status`` and ResourceClaimTemplates), held in memory under one
global, increasing ``resourceVersion`` (a string of an integer, set on an object by every
write to it).

    async with FakeApiServer(token="t") as api:
        pod = api.create_pod("train-0", "team-a", finalizers=["gpushare.io/lease"])
        ... RestKubeApi.from_url(api.url, token="t") ...

What it does as the real server does:

- Lists (``PodList`` ...) carry ``metadata.resourceVersion``; their items have no
  ``kind``/``apiVersion`` (single objects and watch events do), in the order of their
  storage keys (``namespace/name``). Without a ``resourceVersion`` (or ``0``, or with
  ``NotOlderThan``) they serve the current state; ``resourceVersionMatch=Exact`` (and, as
  the legacy rule has it, a ``resourceVersion`` with a ``limit``) the state at that version,
  rebuilt from the history: one compacted away is a plain ``410 Expired`` response.
- Pages (``limit``, ``continue``): a list with ``limit`` sends at most that many items and,
  when more follow, ``metadata.continue``, an opaque token (as the real server's: unpadded
  URL-safe base64 of ``{"v": "meta.k8s.io/v1", "rv": <revision>, "start": <next key>}``),
  and ``metadata.remainingItemCount`` unless a selector was given. Every page of one list
  reads the first page's revision, so all carry its ``resourceVersion`` and together are
  one consistent snapshot, whatever changed meanwhile. A token whose revision was
  compacted away (:meth:`FakeApiServer.compact`, or the history's bound) is ``410 Expired``
  whose ``Status`` carries, in ``metadata.continue``, a token that goes on from the same
  key in the latest state (an inconsistent list); a token the server did not make, or one
  sent with a ``resourceVersion``, is a 400.
- Watches (``watch=1``/``true`` on a list path) stream newline-delimited events of every
  change after ``resourceVersion`` (none or ``0``: an ``ADDED`` per existing object first),
  then live ones, until ``timeoutSeconds`` or the client goes. A selector is applied to the
  old and the new state, so a pod that stops matching is sent as ``DELETED`` and one that
  starts matching as ``ADDED``. The history is bounded (``history=``); a version older than
  it (or than :meth:`FakeApiServer.compact`) gets, on an HTTP 200 stream, one
  ``{"type": "ERROR", "object": <Status 410 Expired>}`` event, and the stream ends.
  BOOKMARKs are sent only when asked for (``allowWatchBookmarks``) and only by
  :meth:`FakeApiServer.bookmark`.
- Field selectors: the fields the real server indexes for each kind (pods: metadata.name,
  metadata.namespace, spec.nodeName, spec.schedulerName, status.phase, ...), ``=``, ``==``,
  ``!=``, comma-separated conjunctions; an unknown field is a 400. Label selectors:
  ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``.
- PATCH: merge patch (RFC 7386), JSON patch (RFC 6902: add, remove, replace, move, copy,
  test; a failing op is ``422 Invalid``), strategic merge patch. A patched object whose
  ``metadata.resourceVersion`` differs from the stored one is ``409 Conflict``. A patch that
  changes nothing writes nothing (no new version, no event). The main resource ignores
  changes to ``status``; the ``/status`` subresource takes only ``status``. Pod specs are
  immutable but for container images, activeDeadlineSeconds, tolerations and
  schedulingGates (422); a pod being deleted takes no new finalizers (422).
- DELETE: a pod with finalizers gets ``deletionTimestamp`` (now + grace) and
  ``deletionGracePeriodSeconds`` (MODIFIED) and stays until a write empties
  ``metadata.finalizers``; that write is not stored but deletes the pod (one DELETED event;
  the event and the patch's response carry the pod as last stored, as etcd's previous value
  does). ``gracePeriodSeconds=0`` (force) changes only the grace period recorded. Without
  finalizers a pod is deleted at once. Preconditions (uid, resourceVersion) are 409s.
- Binding (``pods/{name}/binding``): sets ``spec.nodeName`` and the ``PodScheduled``
  condition; 409 if the pod is bound already or being deleted, or on a uid mismatch.
- ``metadata.generateName``: the prefix (cut to 58 characters) and 5 characters of the
  server's alphabet (consonants and digits), a name not taken.
- resource.k8s.io/v1: list (ResourceClaims and templates also across namespaces), watch,
  get, create, PUT, PATCH, DELETE (``preconditions`` uid/resourceVersion: 409; finalizers
  as for pods, with no grace period) and DELETE of a collection (by selectors: what the
  kubelet does to its node's ResourceSlices). ResourceSlice field selectors:
  ``metadata.name``, ``spec.nodeName``, ``spec.driver`` (``spec.pool.name`` is a 400, as
  on a real server); the others: ``metadata.name``, ``metadata.namespace``. A created
  ResourceClaim's ``status`` is dropped (set it through ``/status``); ``metadata.generation``
  starts at 1 and counts changes of ``spec``. Every write is decoded and validated as the
  real server does it (see "resource.k8s.io/v1: decoding and validation" below): against
  the strict JSON schemas that ``kubernetes-validate`` ships for ``kube_version`` (default
  1.36), a wrong type or a quantity or time that does not parse is a 400, an unknown field a
  400 ``strict decoding error`` (``fieldValidation=Strict``, the stand-in's default; ``Warn``
  drops it with a ``Warning`` header, ``Ignore`` drops it), a missing required field or a
  broken rule a 422 ``Invalid`` whose ``details.causes`` name every field. The rules beyond
  the schema: one of nodeName/nodeSelector/allNodes/perDeviceNodeSelection; pool count > 0;
  driver, pool name and node name immutable; at most 128 devices (64 when one has taints or
  consumes counters), unique names, 32 attributes and capacities; a requestPolicy only with
  ``allowMultipleAllocations``, ``validValues`` (at most 10, ascending, unique, within the
  value, holding ``default``) or ``validRange`` (0 <= min <= default <= max <= value,
  default and max on a step from min, min + step <= value); taints (16, a key, an effect of
  NoSchedule/NoExecute/None); binding conditions (4 and 4, qualified names, no overlap, both
  or neither); a claim's or template's spec immutable; ``status.allocation`` immutable once
  set; ``reservedFor`` only with an allocation; every ``status.devices`` entry an allocated
  (driver, pool, device, shareID), with at most 8 conditions of a qualified type,
  True/False/Unknown, a reason and a lastTransitionTime.

Where it is simpler than the real server (and says so):

- Strategic merge patch is a merge patch whose lists are replaced, except the lists merged
  by key: ``status.conditions`` and ``status.addresses`` by ``type``,
  ``status.containerStatuses`` by ``name`` (``$patch: delete`` in an element removes it;
  other ``$`` directives are ignored). ``metadata.finalizers`` is replaced, not unioned.
- No kubelet: graceful termination is only recorded (``deletionTimestamp``), never waited
  for; no admission, no defaulting beyond the usual pod fields, no managedFields, no
  protobuf.
- Pages: a page with a selector holds ``limit`` matching items (the real server may send
  fewer, even none, with a continue token, since it counts the keys it read); ``limit`` is
  honoured with ``resourceVersion=0`` too (the real server's watch cache may ignore it).
- resource.k8s.io: no defaulting (a real server fills in e.g. ``allocationMode``), no
  feature gates (a real server drops the fields of disabled ones), CEL selectors are not
  compiled, quantities are echoed as sent (not canonicalized), messages of decoding errors
  name the field by its path rather than its Go struct, and the schema's ``required`` holds
  even where the real server takes a zero value (a ResourceClaim needs a ``spec``).

Test helpers: :meth:`create_pod` (from :func:`pod_manifest`), :meth:`delete_pod`,
:meth:`set_pod_phase`, :meth:`patch_pod`, :meth:`create_node`, :meth:`put_object` (any kind,
``status`` included), :attr:`objects` (``api.objects("resourceclaims")``: copies),
:meth:`set_endpoints`,
:meth:`events_for`, :meth:`compact`, :meth:`bookmark`, :meth:`hold_next`, the per-verb
:attr:`requests` counter and the :attr:`log` of requests.

Faults (:meth:`fail_next`), each the way a real API server or the network fails a
request: an error status; a broken connection; no answer until the client's timeout; and
each of these after the request was served, its change made (``landed``: a 5xx or a
timeout whose write happened anyway, as etcd or a proxy in between can leave it). A
:attr:`chaos` hook, asked about every request, draws such faults at random.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import functools
import json
import logging
import posixpath
import re
import secrets
import ssl
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from functools import partial
from typing import Any

import jsonschema
from aiohttp import web
from kubernetes_validate import utils as schemas
from referencing import Registry, Resource

from tests.kube.quantity import FORMAT_MESSAGE as QUANTITY_FORMAT
from tests.kube.quantity import QuantityError, integer_value, parse_quantity, render

Obj = dict[str, Any]
log = logging.getLogger(__name__)

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
MERGE_KEYS = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("status", "containerStatuses"): "name",
    ("status", "initContainerStatuses"): "name",
}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "tolerations", "schedulingGates")
HANG_S = 300.0  # the longest a hanging fault holds a request whose client stays


def timestamp(offset_s: float = 0.0) -> str:
    moment = datetime.now(UTC) + timedelta(seconds=offset_s)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(
    code: int, reason: str, message: str, details: Obj | None = None, meta: Obj | None = None
) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": dict(meta or {}),
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    def __init__(
        self,
        code: int,
        message: str,
        reason: str = "",
        details: Obj | None = None,
        meta: Obj | None = None,
    ):
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details
        self.meta = meta  # the Status's ListMeta (an expired continue's new token)

    def body(self) -> Obj:
        return status_body(self.code, self.reason, self.message, self.details, self.meta)

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.code)


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    details = {"name": name, **({"group": group} if group else {}), "kind": resource}
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(404, f'{qualified} "{name}" not found', details=details)


def conflict(resource: str, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {resource} "{name}": {why}'
    return ApiError(409, message, details={"name": name, "kind": resource})


MODIFIED_WHY = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


# -- selectors -----------------------------------------------------------------------------


def field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


_SET_TERM = re.compile(r"^([A-Za-z0-9./_-]+)\s+(in|notin)\s+\(([^)]*)\)$")
_TERMS = re.compile(r",(?![^()]*\))")


@dataclass(frozen=True)
class Selector:
    fields: tuple[tuple[str, str, bool], ...] = ()  # (path, value, equal)
    labels: tuple[Callable[[Mapping[str, str]], bool], ...] = ()

    @classmethod
    def parse(
        cls,
        fields: str,
        labels: str,
        known: frozenset[str],
        refusal: str = 'field label not supported: "{path}"',
    ) -> Selector:
        """``refusal``: the 400's message for a field the kind has no index of."""
        parsed: list[tuple[str, str, bool]] = []
        for term in filter(None, (t.strip() for t in fields.split(","))):
            split = _split_op(term)
            if split is None:
                raise ApiError(400, f'invalid field selector: "{term}": no operator')
            path, value, equal = split
            if path not in known:
                raise ApiError(400, refusal.format(path=path))
            parsed.append((path, value, equal))
        return cls(tuple(parsed), tuple(_label_term(t) for t in _TERMS.split(labels) if t.strip()))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        if any((field_value(obj, p) == v) != eq for p, v, eq in self.fields):
            return False
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(test(labels) for test in self.labels)


def _split_op(term: str) -> tuple[str, str, bool] | None:
    """``a!=b``, ``a==b``, ``a=b`` -> (a, b, equal)."""
    for op, equal in (("!=", False), ("==", True), ("=", True)):
        if op in term:
            left, right = term.split(op, 1)
            return left.strip(), right.strip(), equal
    return None


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    term = term.strip()
    if match := _SET_TERM.match(term):
        key, op, raw = match.groups()
        values = {v.strip() for v in raw.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if (split := _split_op(term)) is not None:
        key, value, equal = split
        return lambda labels: (labels.get(key) == value) == equal
    if term.startswith("!"):
        return lambda labels: term[1:].strip() not in labels
    if not re.fullmatch(r"[A-Za-z0-9./_-]+", term):
        raise ApiError(400, f"unable to parse requirement: {term!r}")
    return lambda labels: term in labels


# -- patches -------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return _copy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """A merge patch whose lists in :data:`MERGE_KEYS` are merged by their key."""
    if not isinstance(patch, dict):
        return _copy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        where = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and where in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[where], where)
        else:
            result[key] = strategic_merge_patch(result.get(key), value, where)
    return result


def _merge_list(old: list[Any], new: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    merged = [_copy(item) for item in old]
    for item in new:
        if not isinstance(item, dict) or key not in item:
            raise ApiError(400, f"map: {item!r} does not contain declared merge key: {key}")
        at = next((i for i, o in enumerate(merged) if o.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del merged[at]
        elif at is None:
            merged.append(strategic_merge_patch({}, item, path))
        else:
            merged[at] = strategic_merge_patch(merged[at], item, path)
    return merged


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ApiError(422, f"invalid JSON pointer: {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _parent(doc: Any, tokens: list[str], path: str) -> tuple[Any, str]:
    if not tokens:
        raise ApiError(422, f"cannot operate on the whole document at {path!r}")
    node = doc
    for token in tokens[:-1]:
        node = _child(node, token, path)
    return node, tokens[-1]


def _child(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict) and token in node:
        return node[token]
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    raise ApiError(422, f"doc is missing path: {path!r}: missing value")


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902."""
    if not isinstance(ops, list):
        raise ApiError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = _copy(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path")
        tokens = _pointer(path)
        if kind == "test":
            found = doc
            for token in tokens:
                found = _child(found, token, path)
            if found != op.get("value"):
                raise ApiError(422, f"testing value {path} failed: test failed")
            continue
        if kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value: Any = doc
            for token in source:
                value = _child(value, token, op.get("from"))
            value = _copy(value)
            if kind == "move":
                doc = _remove(doc, source, op["from"])
            doc = _add(doc, tokens, value, path)
        elif kind == "add":
            doc = _add(doc, tokens, _copy(op.get("value")), path)
        elif kind == "remove":
            doc = _remove(doc, tokens, path)
        elif kind == "replace":
            doc = _remove(doc, tokens, path)
            doc = _add(doc, tokens, _copy(op.get("value")), path)
        else:
            raise ApiError(400, f"Unexpected kind: {kind}")
    return doc


def _add(doc: Any, tokens: list[str], value: Any, path: str) -> Any:
    if not tokens:
        return value
    parent, last = _parent(doc, tokens, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and (
        last == "-" or (last.isdigit() and int(last) <= len(parent))
    ):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        raise ApiError(422, f"add operation does not apply: doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, tokens: list[str], path: str) -> Any:
    parent, last = _parent(doc, tokens, path)
    _child(parent, last, path)  # it must exist
    del parent[int(last) if isinstance(parent, list) else last]
    return doc


def apply_patch(content_type: str, doc: Obj, patch: Any) -> Obj:
    if content_type == MERGE_PATCH:
        result = merge_patch(doc, patch)
    elif content_type == STRATEGIC_PATCH:
        result = strategic_merge_patch(doc, patch)
    elif content_type == JSON_PATCH:
        result = json_patch(doc, patch)
    else:
        raise ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{JSON_PATCH}, {MERGE_PATCH}, application/apply-patch+yaml, {STRATEGIC_PATCH}",
        )
    if not isinstance(result, dict):
        raise ApiError(422, "the patched object is not an object")
    return result


# -- objects -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    resource: str
    kind: str
    api_version: str
    namespaced: bool
    fields: frozenset[str]  # the field selectors it takes
    refusal: str = 'field label not supported: "{path}"'  # of any other field selector
    checked: bool = False  # decoded and validated as the real server does (resource.k8s.io)

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def qualified(self) -> str:
        """``resourceclaims.resource.k8s.io``: how the server's messages name it."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


PODS = Kind(
    "pods",
    "Pod",
    "v1",
    True,
    frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
)
NODES = Kind("nodes", "Node", "v1", False, frozenset({"metadata.name", "spec.unschedulable"}))
EVENTS = Kind(
    "events",
    "Event",
    "v1",
    True,
    frozenset(
        {"metadata.name", "metadata.namespace", "reason", "reportingComponent", "source", "type"}
        | {f"involvedObject.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion")}
        | {"involvedObject.resourceVersion", "involvedObject.fieldPath"}
    ),
)
SLICES = Kind(
    "endpointslices",
    "EndpointSlice",
    "discovery.k8s.io/v1",
    True,
    frozenset({"metadata.name", "metadata.namespace", "addressType"}),
)
LEASES = Kind(
    "leases",
    "Lease",
    "coordination.k8s.io/v1",
    True,
    frozenset({"metadata.name", "metadata.namespace"}),
)
DRA_VERSION = "resource.k8s.io/v1"
_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
_META_REFUSAL = '"{path}" is not a known field selector: only "metadata.name", "metadata.namespace"'
DEVICE_CLASSES = Kind(
    "deviceclasses", "DeviceClass", DRA_VERSION, False, _META_FIELDS, _META_REFUSAL, True
)
RESOURCE_SLICES = Kind(
    "resourceslices",
    "ResourceSlice",
    DRA_VERSION,
    False,
    frozenset({"metadata.name", "spec.nodeName", "spec.driver"}),
    "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {path}",
    True,
)
RESOURCE_CLAIMS = Kind(
    "resourceclaims", "ResourceClaim", DRA_VERSION, True, _META_FIELDS, _META_REFUSAL, True
)
CLAIM_TEMPLATES = Kind(
    "resourceclaimtemplates",
    "ResourceClaimTemplate",
    DRA_VERSION,
    True,
    _META_FIELDS,
    _META_REFUSAL,
    True,
)
DRA_KINDS = (DEVICE_CLASSES, RESOURCE_SLICES, RESOURCE_CLAIMS, CLAIM_TEMPLATES)
# apps/v1 DaemonSets: get, list and delete only; a test puts them in place, status
# included (put_object), as their controller would have written them.
DAEMON_SETS = Kind("daemonsets", "DaemonSet", "apps/v1", True, _META_FIELDS, _META_REFUSAL)
KINDS = {k.resource: k for k in (PODS, NODES, EVENTS, SLICES, LEASES, DAEMON_SETS, *DRA_KINDS)}
Key = tuple[str, str]  # (namespace, name); namespace "" for nodes


def pod_manifest(
    name: str,
    namespace: str = "default",
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    scheduler_name: str = "",
    node_name: str = "",
    finalizers: Iterable[str] = (),
    limits: Mapping[str, Any] | None = None,
    image: str = "registry.example/train:1.0",
    run_as_user: int | None = None,
) -> Obj:
    """A pod as ``kubectl apply`` sends it; ``run_as_user``: its
    ``spec.securityContext.runAsUser``."""
    container: Obj = {"name": "main", "image": image, "command": ["python", "train.py"]}
    if limits:
        container["resources"] = {"limits": dict(limits)}
    spec: Obj = {"containers": [container]}
    if run_as_user is not None:
        spec["securityContext"] = {"runAsUser": run_as_user}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if node_name:
        spec["nodeName"] = node_name
    metadata: Obj = {"name": name, "namespace": namespace}
    for key, value in (("annotations", annotations), ("labels", labels)):
        if value:
            metadata[key] = dict(value)
    if finalizers := list(finalizers):
        metadata["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _qos(spec: Obj) -> str:
    resources = [c.get("resources") or {} for c in spec.get("containers") or []]
    if not any(r.get("limits") or r.get("requests") for r in resources):
        return "BestEffort"
    for r in resources:
        limits = r.get("limits") or {}
        requests = r.get("requests") or limits
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name) != limits[name]:
                return "Burstable"
    return "Guaranteed"


def default_pod(pod: Obj) -> None:
    """The defaults and the status the real server gives a new pod."""
    spec = pod.setdefault("spec", {})
    for key, value in (
        ("schedulerName", "default-scheduler"),
        ("restartPolicy", "Always"),
        ("terminationGracePeriodSeconds", 30),
        ("dnsPolicy", "ClusterFirst"),
        ("serviceAccountName", "default"),
        ("securityContext", {}),
        ("enableServiceLinks", True),
        ("priority", 0),
        ("preemptionPolicy", "PreemptLowerPriority"),
    ):
        spec.setdefault(key, value)
    for container in spec.get("containers") or []:
        latest = ":" not in str(container.get("image", "")).rsplit("/", 1)[-1]
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
    spec.setdefault("tolerations", [])
    for taint in ("not-ready", "unreachable"):
        toleration = {
            "key": f"node.kubernetes.io/{taint}",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        }
        if not any(t.get("key") == toleration["key"] for t in spec["tolerations"]):
            spec["tolerations"].append(toleration)
    pod["status"] = {"phase": "Pending", "qosClass": _qos(spec)}


def _pod_spec_frozen(spec: Obj) -> Obj:
    frozen = {k: v for k, v in spec.items() if k not in _MUTABLE_POD_SPEC}
    for key in ("containers", "initContainers"):
        if key in frozen:
            frozen[key] = [{k: v for k, v in c.items() if k != "image"} for c in frozen[key]]
    return frozen


# -- resource.k8s.io/v1: decoding and validation --------------------------------------------
#
# A write of a resource.k8s.io object goes through the real server's two stages: decoding,
# whose failures are 400s (a value of the wrong JSON type, a quantity or a time that does not
# parse, and, with ``fieldValidation=Strict``, an unknown field), then validation, whose
# failures are one 422 ``Invalid`` listing every field error. The schema part of both comes
# from the strict JSON schemas of the ``kubernetes-validate`` package for one Kubernetes
# version; the checks a schema cannot express follow k8s.io/kubernetes
# pkg/apis/resource/validation (limits from k8s.io/api/resource/v1 types.go).

FIELD_VALIDATIONS = ("Strict", "Warn", "Ignore")
MAX_DEVICES = 128
MAX_DEVICES_TAINTED = 64  # when any device of the slice has taints or consumes counters
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_VALID_VALUES = 10
MAX_BINDING_CONDITIONS = 4  # and as many binding failure conditions
MAX_TAINTS = 16
MAX_DEVICE_CONDITIONS = 8
MAX_ALLOCATION_RESULTS = 32
MAX_RESERVED_FOR = 256
_TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")
_CONDITION_STATUSES = ("False", "True", "Unknown")
_QUANTITY_DEF = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_MAP_FIELDS = frozenset(
    {"annotations", "attributes", "capacity", "consumedCapacity", "counters", "labels"}
    | {"nodeAllocatableResourceMappings", "nodeAllocatableResources", "requests"}
)  # their keys are shown as [key] in field paths, as Go's field.Path.Key does
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_REASON_RULE = (
    "a condition reason must start with alphabetic character, optionally followed by a string "
    "of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' "
    "(e.g. 'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or "
    "'ReasonA:ReasonB', regex used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')"
)
_QUALIFIED = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$"
)
_QUALIFIED_RULE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_GO_TYPES = {"integer": "int64", "number": "float64", "boolean": "bool", "string": "string"}
_FORMATS = jsonschema.FormatChecker(formats=())


@_FORMATS.checks("k8s-quantity", raises=QuantityError)
def _is_quantity(value: object) -> bool:
    parse_quantity(value)
    return True


@_FORMATS.checks("date-time", raises=ValueError)
def _is_time(value: object) -> bool:
    if isinstance(value, str) and not _RFC3339.match(value):
        raise ValueError(value)
    if isinstance(value, str):
        datetime.fromisoformat(value)  # a real date and time
    return True


def _schema_file(version: str, name: str) -> Any:
    path = f"kubernetes-json-schema/v{version}.0-local-strict/{name}"
    return schemas.schema_contents(path, version)


@functools.cache
def kube_versions() -> tuple[str, ...]:
    """The Kubernetes versions (``1.34`` ...) whose resource.k8s.io/v1 schemas are installed."""
    found = []
    for version in dict.fromkeys(schemas.major_minor(v) for v in schemas.all_versions()):
        try:
            _schema_file(version, "resourceclaim-resource-v1.json")
        except (FileNotFoundError, schemas.VersionNotSupportedError):
            continue
        found.append(version)
    return tuple(found)


def supported_version(version: str) -> str:
    """``1.36`` for ``v1.36.2``; a ValueError for a version without those schemas."""
    wanted = schemas.major_minor(version.removeprefix("v"))
    if wanted not in kube_versions():
        installed = ", ".join(kube_versions())
        raise ValueError(f"no resource.k8s.io/v1 schemas for Kubernetes {version} ({installed})")
    return wanted


@functools.cache
def _validator(version: str, kind: str) -> jsonschema.Draft202012Validator:
    """The strict schema of ``kind`` (resource.k8s.io/v1) of Kubernetes ``version``, whose
    quantities are checked as the server's decoder reads them."""
    schema = _schema_file(version, f"{kind.lower()}-resource-v1.json")
    definitions = _schema_file(version, "_definitions.json")
    quantity = {"type": ["string", "number", "null"], "format": "k8s-quantity"}
    definitions["$defs"][_QUANTITY_DEF] = quantity
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry, format_checker=_FORMATS)


_CAUSES = {
    "Required value": "FieldValueRequired",
    "Invalid value": "FieldValueInvalid",
    "Unsupported value": "FieldValueNotSupported",
    "Too many": "FieldValueTooMany",
    "Duplicate value": "FieldValueDuplicate",
    "Forbidden": "FieldValueForbidden",
}


@dataclass(frozen=True)
class FieldError:
    """One error of the server's validation: ``spec.x: Invalid value: 3: why``."""

    path: str
    type: str  # a key of _CAUSES
    detail: str = ""
    value: Any = None

    def body(self) -> str:
        shown = json.dumps(self.value, separators=(",", ":"), sort_keys=True)
        text = (
            self.type if self.type in ("Required value", "Forbidden") else f"{self.type}: {shown}"
        )
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.path}: {self.body()}"

    def cause(self) -> Obj:
        return {"reason": _CAUSES[self.type], "message": self.body(), "field": self.path}


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "Required value", detail)


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "Invalid value", detail, value)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, "Forbidden", detail)


def too_many(path: str, count: int, limit: int) -> FieldError:
    return FieldError(path, "Too many", f"must have at most {limit} items", count)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError(path, "Duplicate value", "", value)


def not_supported(path: str, value: Any, supported: Iterable[str]) -> FieldError:
    listed = ", ".join(json.dumps(s) for s in supported)
    return FieldError(path, "Unsupported value", f"supported values: {listed}", value)


def invalid_object(kind: Kind, name: str, errors: list[FieldError]) -> ApiError:
    """The 422 ``Invalid`` Status of ``errors``, as the real server words it."""
    listed = str(errors[0]) if len(errors) == 1 else f"[{', '.join(map(str, errors))}]"
    details = {
        "name": name,
        "group": kind.group,
        "kind": kind.kind,
        "causes": [e.cause() for e in errors],
    }
    message = f'{kind.kind}.{kind.group} "{name}" is invalid: {listed}'
    return ApiError(422, message, details=details)


def field_path(parts: Iterable[Any]) -> str:
    """``spec.devices[0].capacity[memory]`` for the JSON path of a value."""
    text, parent = "", ""
    for part in parts:
        if isinstance(part, int) or parent in _MAP_FIELDS:
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
        # a map's key is no field: a value under it is not shown as a key
        parent = part if isinstance(part, str) and not text.endswith("]") else ""
    return text


@dataclass
class SchemaReport:
    """What the schema says of an object, by the stage of the server that would say it."""

    undecodable: list[str] = field(default_factory=list)  # 400s of the decoder
    unknown: list[tuple[tuple[Any, ...], str]] = field(default_factory=list)  # (parent, key)
    invalid: list[FieldError] = field(default_factory=list)  # 422s of validation


def schema_report(version: str, kind: Kind, obj: Obj) -> SchemaReport:
    report = SchemaReport()
    for error in _validator(version, kind.kind).iter_errors(obj):
        path = tuple(error.absolute_path)
        check = error.validator
        if check == "additionalProperties":
            known = error.schema.get("properties") or {}
            report.unknown += [(path, key) for key in error.instance if key not in known]
        elif check in ("type", "format"):
            report.undecodable.append(_undecodable(kind, path, error))
        elif check == "required":
            missing = [k for k in error.validator_value if k not in error.instance]
            report.invalid += [required(field_path((*path, key))) for key in missing]
        elif check == "enum":
            report.invalid.append(
                not_supported(field_path(path), error.instance, error.validator_value)
            )
        else:
            report.invalid.append(invalid(field_path(path), error.instance, error.message))
    return report


def _undecodable(kind: Kind, path: tuple[Any, ...], error: jsonschema.ValidationError) -> str:
    where, value = field_path(path), error.instance
    if error.validator_value == "k8s-quantity":
        detail = QUANTITY_FORMAT
    elif error.validator == "format":
        detail = f'parsing time {json.dumps(value)} as "2006-01-02T15:04:05Z07:00": cannot parse'
    else:
        wanted = [t for t in _listed(error.validator_value) if t != "null"]
        go_type = _GO_TYPES.get(wanted[0], "struct") if wanted else "struct"
        detail = (
            f"json: cannot unmarshal {_json_type(value)} into Go struct field {where} "
            f"of type {go_type}"
        )
    return f'{kind.kind} in version "v1" cannot be handled as a {kind.kind}: {detail}'


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    names = {str: "string", list: "array", dict: "object"}
    return next((n for t, n in names.items() if isinstance(value, t)), "null")


def _dedupe(errors: list[FieldError]) -> list[FieldError]:
    """One error per field and type: the first (the server's checks come before the
    schema's plainer ``Required value``)."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for error in errors:
        if (error.path, error.type) not in seen:
            seen.add((error.path, error.type))
            kept.append(error)
    return kept


def _duplicates(keys: Iterable[Any], at: str, suffix: str = "") -> list[FieldError]:
    """A ``Duplicate value`` at ``at[i]<suffix>`` for every key seen before."""
    seen: set[Any] = set()
    errors = []
    for i, key in enumerate(keys):
        if key in seen:
            errors.append(duplicate(f"{at}[{i}]{suffix}", key))
        seen.add(key)
    return errors


def _qualified_name_errors(name: str, at: str) -> list[FieldError]:
    if not name:
        return [invalid(at, name, "name part must be non-empty")]
    return [] if _QUALIFIED.match(name) else [invalid(at, name, _QUALIFIED_RULE)]


# ResourceSlice


def slice_errors(obj: Obj, old: Obj | None) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = _node_selection_errors(spec) + _pool_errors(spec.get("pool") or {})
    if old is not None:
        before = old.get("spec") or {}
        for keys in (("driver",), ("pool", "name"), ("nodeName",)):
            if _nested(spec, keys) != _nested(before, keys):
                errors.append(invalid(field_path(("spec", *keys)), _nested(spec, keys), IMMUTABLE))
    return errors + _devices_errors([d or {} for d in spec.get("devices") or []])


IMMUTABLE = "field is immutable"


def _nested(obj: Obj, keys: Iterable[str]) -> Any:
    value: Any = obj
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _node_selection_errors(spec: Obj) -> list[FieldError]:
    one_of = (
        "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` "
        "is required"
    )
    chosen, errors = [], []
    for key in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection"):
        value = spec.get(key)
        if value in ("", False):
            why = "a non-empty string" if key == "nodeName" else "true"
            errors.append(invalid(f"spec.{key}", value, f"must be either unset or set to {why}"))
        elif value is not None:
            chosen.append(f"`{key}`")
    if not chosen:
        errors.append(required("spec", one_of))
    elif len(chosen) > 1:
        listed = "{" + ", ".join(chosen) + "}"
        errors.append(invalid("spec", listed, f"{one_of}, but multiple fields are set"))
    return errors


def _pool_errors(pool: Obj) -> list[FieldError]:
    errors = []
    if (count := pool.get("resourceSliceCount") or 0) <= 0:
        errors.append(invalid("spec.pool.resourceSliceCount", count, "must be greater than zero"))
    if (generation := pool.get("generation") or 0) < 0:
        why = "must be greater than or equal to zero"
        errors.append(invalid("spec.pool.generation", generation, why))
    return errors


def _devices_errors(devices: list[Obj]) -> list[FieldError]:
    at = "spec.devices"
    tainted = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    limit = MAX_DEVICES_TAINTED if tainted else MAX_DEVICES
    if len(devices) > limit:
        return [too_many(at, len(devices), limit)]  # and nothing else, as the server does
    errors = [e for i, d in enumerate(devices) for e in _device_errors(d, f"{at}[{i}]")]
    return errors + _duplicates([d.get("name") for d in devices], at)


def _device_errors(device: Obj, at: str) -> list[FieldError]:
    capacities = device.get("capacity") or {}
    errors = []
    count = len(device.get("attributes") or {}) + len(capacities)
    if count > MAX_ATTRIBUTES_AND_CAPACITIES:
        limit = MAX_ATTRIBUTES_AND_CAPACITIES
        why = f"the total number of attributes and capacities must not exceed {limit}"
        errors.append(invalid(at, count, why))
    shared = device.get("allowMultipleAllocations") is True
    for name, capacity in capacities.items():
        errors += _capacity_errors(capacity or {}, f"{at}.capacity[{name}]", shared)
    errors += _taint_errors([t or {} for t in device.get("taints") or []], f"{at}.taints")
    return errors + _binding_errors(device, at)


def _capacity_errors(capacity: Obj, at: str, shared: bool) -> list[FieldError]:
    policy = capacity.get("requestPolicy")
    if policy is None:
        return []
    if not shared:
        return [forbidden(f"{at}.requestPolicy", "allowMultipleAllocations must be true")]
    return _policy_errors(capacity.get("value"), policy, f"{at}.requestPolicy")


def _policy_errors(value: Any, policy: Obj, at: str) -> list[FieldError]:
    values, bounds, default = (
        policy.get("validValues") or [],
        policy.get("validRange"),
        policy.get("default"),
    )
    if values and bounds is not None:
        both = (
            "exactly one policy can be specified, "
            'cannot specify "validValues" and "validRange" at the same time'
        )
        return [forbidden(at, both)]
    if not values and bounds is None:
        return []
    if default is None:
        which = "validValues" if values else "validRange"
        return [required(f"{at}.default", f"required when {which} is defined")]
    if values:
        return _valid_values_errors(default, value, values, f"{at}.validValues")
    return _range_errors(default, value, bounds, f"{at}.validRange")


def _valid_values_errors(default: Any, value: Any, values: list[Any], at: str) -> list[FieldError]:
    amounts = [parse_quantity(v) for v in values]
    errors = [
        invalid(f"{at}[{i}]", str(values[i]), "values must be sorted in ascending order")
        for i in range(1, len(amounts))
        if amounts[i - 1] > amounts[i]
    ]
    if len(values) > MAX_VALID_VALUES:
        errors.append(too_many(at, len(values), MAX_VALID_VALUES))
    else:
        errors += _option_errors(values, amounts, value, at)
    if len(values) > MAX_VALID_VALUES or parse_quantity(default) not in amounts:
        why = "default value is not valid according to the requestPolicy"
        errors.append(invalid(at, str(default), why))
    return errors


def _option_errors(
    values: list[Any], amounts: list[Fraction], value: Any, at: str
) -> list[FieldError]:
    capacity = parse_quantity(value)
    errors = [
        invalid(f"{at}[{i}]", str(text), f"option is larger than capacity value: {value}")
        for i, (text, amount) in enumerate(zip(values, amounts, strict=True))
        if amount > capacity
    ]
    return errors + _duplicates([str(integer_value(a)) for a in amounts], at)


def _range_errors(default: Any, value: Any, bounds: Obj, at: str) -> list[FieldError]:
    if bounds.get("min") is None:
        return [required(f"{at}.min", "required when validRange is defined")]
    text = {key: bounds.get(key) for key in ("min", "max", "step")}
    text |= {"default": default, "value": value}
    q = {key: parse_quantity(v) for key, v in text.items()}
    rules = [  # (broken, the field named, the value shown, why)
        (q["min"] < 0, "min", "min", "must be greater than or equal to zero"),
        (q["min"] > q["value"], "min", "min", f"min is larger than capacity value: {value}"),
        (q["default"] < q["min"], "min", "default", f"default is less than min: {text['min']}"),
    ]
    if text["max"] is not None:
        rules += [
            (q["min"] > q["max"], "max", "min", f"min is larger than max: {text['max']}"),
            (q["max"] > q["value"], "max", "max", f"max is larger than capacity value: {value}"),
            (q["default"] > q["max"], "max", "default", f"default is more than max: {text['max']}"),
        ]
    errors = [
        invalid(f"{at}.{name}", str(text[shown]), why)
        for broken, name, shown, why in rules
        if broken
    ]
    if text["step"] is not None:
        errors += _step_errors(text, q, f"{at}.step")
    return errors


def _step_errors(text: Obj, q: dict[str, Fraction], at: str) -> list[FieldError]:
    step, low = integer_value(q["step"]), integer_value(q["min"])
    if step <= 0:
        return [invalid(at, str(text["step"]), "must be greater than zero")]
    errors = []
    if q["min"] + q["step"] > q["value"]:
        one_step = render(q["min"] + q["step"])
        why = f"one step {one_step} is larger than capacity value: {text['value']}"
        errors.append(invalid(at, str(text["step"]), why))
    for key in ("default", "max"):
        if text[key] is not None and (integer_value(q[key]) - low) % step:
            why = f"value is not a multiple of a given step ({text['step']}) from ({text['min']})"
            errors.append(invalid(at, str(text[key]), why))
    return errors


def _taint_errors(taints: list[Obj], at: str) -> list[FieldError]:
    if len(taints) > MAX_TAINTS:
        return [too_many(at, len(taints), MAX_TAINTS)]
    errors = []
    for i, taint in enumerate(taints):
        errors += _qualified_name_errors(taint.get("key") or "", f"{at}[{i}].key")
        effect = taint.get("effect") or ""
        if not effect:
            errors.append(required(f"{at}[{i}].effect"))
        elif effect not in _TAINT_EFFECTS:
            errors.append(not_supported(f"{at}[{i}].effect", effect, _TAINT_EFFECTS))
    return errors


def _binding_errors(holder: Obj, at: str) -> list[FieldError]:
    """The binding conditions of a device or of an allocation result."""
    conditions = holder.get("bindingConditions") or []
    failures = holder.get("bindingFailureConditions") or []
    errors = _condition_names_errors(conditions, f"{at}.bindingConditions")
    errors += _condition_names_errors(failures, f"{at}.bindingFailureConditions")
    overlap = "bindingFailureConditions must not overlap with bindingConditions"
    errors += [
        invalid(f"{at}.bindingFailureConditions[{i}]", name, overlap)
        for i, name in enumerate(failures)
        if name in conditions
    ]
    if failures and not conditions:
        why = "bindingConditions are required to use bindingFailureConditions"
        errors.append(invalid(f"{at}.bindingConditions", holder.get("bindingConditions"), why))
    if conditions and not failures:
        why = "bindingFailureConditions are required to use bindingConditions"
        errors.append(
            invalid(f"{at}.bindingFailureConditions", holder.get("bindingFailureConditions"), why)
        )
    return errors


def _condition_names_errors(names: list[str], at: str) -> list[FieldError]:
    if len(names) > MAX_BINDING_CONDITIONS:
        errors = [too_many(at, len(names), MAX_BINDING_CONDITIONS)]
    else:
        errors = [
            e for i, n in enumerate(names) for e in _qualified_name_errors(n or "", f"{at}[{i}]")
        ]
    return errors + _duplicates(names, at)


# ResourceClaim, ResourceClaimTemplate, DeviceClass


def claim_errors(obj: Obj, old: Obj | None) -> list[FieldError]:
    status = obj.get("status") or {}
    before = (old or {}).get("status") or {}
    errors = _immutable_spec(obj, old)
    errors += _allocation_errors(status.get("allocation"), before.get("allocation"))
    return errors + _reserved_for_errors(status) + _device_status_errors(status)


def template_errors(obj: Obj, old: Obj | None) -> list[FieldError]:
    return _immutable_spec(obj, old)


def class_errors(_obj: Obj, _old: Obj | None) -> list[FieldError]:
    return []  # nothing past the schema (the server compiles CEL selectors; not here)


def _immutable_spec(obj: Obj, old: Obj | None) -> list[FieldError]:
    if old is None or obj.get("spec") == old.get("spec"):
        return []
    return [invalid("spec", obj.get("spec"), IMMUTABLE)]


def _allocation_errors(allocation: Obj | None, before: Obj | None) -> list[FieldError]:
    at = "status.allocation"
    if allocation is None:
        return []
    if before is not None:
        return [] if allocation == before else [invalid(at, allocation, IMMUTABLE)]
    results = [r or {} for r in (allocation.get("devices") or {}).get("results") or []]
    if len(results) > MAX_ALLOCATION_RESULTS:
        return [too_many(f"{at}.devices.results", len(results), MAX_ALLOCATION_RESULTS)]
    return [
        e for i, r in enumerate(results) for e in _binding_errors(r, f"{at}.devices.results[{i}]")
    ]


def _reserved_for_errors(status: Obj) -> list[FieldError]:
    at = "status.reservedFor"
    reserved = [r or {} for r in status.get("reservedFor") or []]
    if len(reserved) > MAX_RESERVED_FOR:
        return [too_many(at, len(reserved), MAX_RESERVED_FOR)]
    errors = [
        required(f"{at}[{i}].{key}")
        for i, ref in enumerate(reserved)
        for key in ("resource", "name", "uid")
        if not ref.get(key)
    ]
    errors += _duplicates([r.get("uid") for r in reserved], at)
    if reserved and status.get("allocation") is None:
        errors.append(forbidden(at, "may not be specified when `allocated` is not set"))
    return errors


def _device_status_errors(status: Obj) -> list[FieldError]:
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    allocated = {_device_id(r or {}) for r in results}
    entries = [e or {} for e in status.get("devices") or []]
    errors = []
    for i, entry in enumerate(entries):
        if (device := _device_id(entry)) not in allocated:
            errors.append(
                invalid(f"status.devices[{i}]", device, "must be an allocated device in the claim")
            )
        errors += _conditions_errors(
            [c or {} for c in entry.get("conditions") or []], f"status.devices[{i}].conditions"
        )
    return errors + _duplicates([_device_id(e) for e in entries], "status.devices")


def _device_id(entry: Obj) -> str:
    """``driver/pool/device``, then ``/shareID`` for a share of a device."""
    parts = [entry.get("driver") or "", entry.get("pool") or "", entry.get("device") or ""]
    return "/".join(parts + ([entry["shareID"]] if entry.get("shareID") else []))


def _conditions_errors(conditions: list[Obj], at: str) -> list[FieldError]:
    errors = []
    if len(conditions) > MAX_DEVICE_CONDITIONS:
        errors.append(too_many(at, len(conditions), MAX_DEVICE_CONDITIONS))
    errors += [e for i, c in enumerate(conditions) for e in _condition_errors(c, f"{at}[{i}]")]
    return errors + _duplicates([c.get("type") for c in conditions], at, ".type")


def _condition_errors(condition: Obj, at: str) -> list[FieldError]:
    """metav1.Condition, as ValidateConditions checks one."""
    errors = _qualified_name_errors(condition.get("type") or "", f"{at}.type")
    if (status := condition.get("status") or "") not in _CONDITION_STATUSES:
        errors.append(not_supported(f"{at}.status", status, _CONDITION_STATUSES))
    if (generation := condition.get("observedGeneration") or 0) < 0:
        errors.append(
            invalid(f"{at}.observedGeneration", generation, "must be greater than or equal to zero")
        )
    if not condition.get("lastTransitionTime"):
        errors.append(required(f"{at}.lastTransitionTime", "must be set"))
    if not (reason := condition.get("reason") or ""):
        errors.append(required(f"{at}.reason", "must be set"))
    elif not _REASON.match(reason):
        errors.append(invalid(f"{at}.reason", reason, _REASON_RULE))
    return errors


_CHECKS: dict[str, Callable[[Obj, Obj | None], list[FieldError]]] = {
    "deviceclasses": class_errors,
    "resourceslices": slice_errors,
    "resourceclaims": claim_errors,
    "resourceclaimtemplates": template_errors,
}


@dataclass
class Call:
    """What one request asks of the decoder (``fieldValidation``) and the warnings it earns
    (sent as ``Warning`` headers)."""

    field_validation: str
    warnings: list[str] = field(default_factory=list)


_CALL: contextvars.ContextVar[Call] = contextvars.ContextVar("fake_apiserver_call")


@dataclass
class _Asker:
    client: str  # whose token the request came with (see FakeApiServer.client_token)
    counted: bool = False  # the claims of its answer were counted already


_ASKER: contextvars.ContextVar[_Asker | None] = contextvars.ContextVar(
    "fake_apiserver_asker", default=None
)


@dataclass
class ClientReads:
    """What the API server sent one client (every connection made with its token):
    ``own`` / ``foreign``: bytes of ResourceClaims (list items, single objects, watch
    events) whose allocation named (ever, or now) that client's node, or not (unallocated
    claims, other nodes' claims); ``requests``: every request it made; ``watch_bytes``:
    every watch event line sent to it, of any kind (bookmarks included)."""

    own: int = 0
    foreign: int = 0
    requests: int = 0
    watch_bytes: int = 0
    watch_claim_bytes: int = 0  # of own + foreign, those that came in watch events


@dataclass
class Change:
    version: int
    resource: str
    type: str
    obj: Obj
    old: Obj | None  # the state before (MODIFIED, DELETED)
    # the event as sent, by type: encoded once for every watcher that sees it so
    lines: dict[str, bytes] = field(default_factory=dict)


@dataclass(eq=False)  # hashed by identity: a set of them
class Watcher:
    kind: Kind
    namespace: str
    selector: Selector
    bookmarks: bool
    queue: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)  # lines
    client: str = ""  # whose token opened it (FakeApiServer.client_token), or ""


@dataclass
class Fault:
    """How the next matching requests are answered (see :meth:`FakeApiServer.fail_next`)."""

    method: str
    path: re.Pattern[str]
    status: int  # 0: the connection breaks instead of an answer
    reason: str
    message: str
    times: int
    landed: bool = False  # served first (its change made), then answered this way
    hang: bool = False  # no answer until the client gives up (or HANG_S), then a break


@dataclass
class Hold:
    """A request held before it is served: ``arrived`` is set when it comes, and it goes
    on once ``release`` is set (or is dropped with its connection if the client left)."""

    method: str
    path: re.Pattern[str]
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


# the state the kubelet reports for every container of a pod in that phase
_CONTAINER_STATES: dict[str, Obj] = {
    "Running": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    "Succeeded": {"terminated": {"exitCode": 0, "reason": "Completed"}},
    "Failed": {"terminated": {"exitCode": 1, "reason": "Error"}},
}


def _copy(value: Any) -> Any:
    """A deep copy of a JSON value (what the store holds), without deepcopy's memo."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def _event_for(watcher: Watcher, change: Change) -> Obj | None:
    """The change as this watcher sees it (its namespace, its selector), or None."""
    if change.resource != watcher.kind.resource:
        return None
    namespace = change.obj["metadata"].get("namespace", "")
    if watcher.namespace and namespace != watcher.namespace:
        return None
    now = watcher.selector.matches(change.obj)
    before = change.old is not None and watcher.selector.matches(change.old)
    if change.type == "MODIFIED" and now != before:
        kind = "ADDED" if now else "DELETED"
    elif change.type == "DELETED":
        kind = "DELETED" if now else ""
    else:
        kind = change.type if now else ""
    # change.obj is a copy of its own that nothing changes: the watchers share it
    return {"type": kind, "object": change.obj} if kind else None


def _encoded(event: Obj) -> bytes:
    """One line of a watch stream."""
    return json.dumps(event).encode() + b"\n"


def _line(event: Obj, change: Change) -> bytes:
    """``event`` (of ``change``) as one line of a watch stream, encoded once."""
    kind = event["type"]
    if kind not in change.lines:
        change.lines[kind] = _encoded(event)
    return change.lines[kind]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeApiServer:
    """The stand-in (see the module's text). ``async with`` starts it on 127.0.0.1."""

    def __init__(
        self,
        *,
        token: str = "",
        tokens: Mapping[str, str] | None = None,
        history: int = 1000,
        ssl_context: ssl.SSLContext | None = None,
        kube_version: str = "1.36",
        field_validation: str = "Strict",
    ) -> None:
        """``kube_version``: whose resource.k8s.io/v1 schemas validate writes (see
        :func:`kube_versions`). ``field_validation``: how a write of a resource.k8s.io object
        that names no ``fieldValidation`` is decoded (the real server's default is ``Warn``,
        kubectl sends ``Strict``). ``tokens``: bearer token -> client name (a node's name
        for a node's agent), each accepted beside ``token`` and its requests counted for
        that client (:meth:`client_token`, :meth:`claim_bytes_read`)."""
        if field_validation not in FIELD_VALIDATIONS:
            raise ValueError(f"field_validation: one of {FIELD_VALIDATIONS}")
        self.token = token
        self.tokens: dict[str, str] = dict(tokens or {})
        self.reads: dict[str, ClientReads] = {}  # client name -> what it was sent
        self._claim_nodes: dict[str, set[str]] = {}  # claim uid -> nodes it was allocated to
        self._claim_sizes: dict[str, tuple[str, int]] = {}  # uid -> (resourceVersion, bytes)
        self._unchecked = False  # put_objects(check_each=False) after its first object
        self.kube_version = supported_version(kube_version)
        self.field_validation = field_validation
        self.version = 0
        self.objects = Store({resource: {} for resource in KINDS})
        self.history: deque[Change] = deque(maxlen=history)
        self.floor = 0  # a watch from a version below this one has expired
        self.requests: Counter[str] = Counter()  # by Kubernetes verb: get, list, watch, ...
        # (method, path with query, content type) of every request, in order
        self.log: list[tuple[str, str, str]] = []
        # (path, DeleteOptions) of every DaemonSet DELETE, in order
        self.deletions: list[tuple[str, Obj]] = []
        self.faults: list[Fault] = []
        # asked about every request before the faults above: a fault to answer it with, or
        # None (a benchmark's random faults: bench/faults.py)
        self.chaos: Callable[[web.Request], Awaitable[Fault | None]] | None = None
        self.hanging = 0  # requests held by a hanging fault now
        self.holds: list[Hold] = []
        self.watchers: set[Watcher] = set()
        self._ssl = ssl_context
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.app = web.Application(middlewares=[self._middleware])
        self._routes()

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> FakeApiServer:
        self._runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"{'https' if self._ssl else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for watcher in list(self.watchers):
            watcher.queue.put_nowait(None)  # end every watch stream
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _routes(self) -> None:
        ns = "/api/v1/namespaces/{namespace}"
        add = self.app.router.add_route
        for path, kind in (
            ("/api/v1/pods", PODS),
            (f"{ns}/pods", PODS),
            ("/api/v1/nodes", NODES),
            ("/api/v1/events", EVENTS),
            (f"{ns}/events", EVENTS),
            ("/apis/discovery.k8s.io/v1/endpointslices", SLICES),
            ("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices", SLICES),
        ):
            add("GET", path, partial(self._list, kind))
        for path, kind in (
            (f"{ns}/pods", PODS),
            ("/api/v1/nodes", NODES),
            (f"{ns}/events", EVENTS),
        ):
            add("POST", path, partial(self._create, kind))
            add("GET", path + "/{name}", partial(self._get, kind))
            add("PATCH", path + "/{name}", partial(self._patch, kind, ""))
        for path, kind in ((f"{ns}/pods", PODS), ("/api/v1/nodes", NODES)):
            add("GET", path + "/{name}/status", partial(self._get, kind))
            add("PATCH", path + "/{name}/status", partial(self._patch, kind, "status"))
        add("DELETE", f"{ns}/pods/{{name}}", self._delete_pod)
        add("DELETE", "/api/v1/nodes/{name}", self._delete_node)
        add("POST", f"{ns}/pods/{{name}}/binding", self._bind)
        leases = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        add("POST", leases, partial(self._create, LEASES))
        add("GET", leases + "/{name}", partial(self._get, LEASES))
        add("PUT", leases + "/{name}", partial(self._replace, LEASES, ""))
        daemon_sets = "/apis/apps/v1/namespaces/{namespace}/daemonsets"
        add("GET", daemon_sets, partial(self._list, DAEMON_SETS))
        add("GET", daemon_sets + "/{name}", partial(self._get, DAEMON_SETS))
        add("DELETE", daemon_sets + "/{name}", self._delete_daemon_set)
        self._dra_routes()

    def _dra_routes(self) -> None:
        """resource.k8s.io/v1: every verb on the four kinds, ResourceClaim's ``/status``."""
        add = self.app.router.add_route
        group = f"/apis/{DRA_VERSION}"
        for kind in DRA_KINDS:
            collection = f"{group}/{kind.resource}"
            if kind.namespaced:
                add("GET", collection, partial(self._list, kind))  # all namespaces
                collection = f"{group}/namespaces/{{namespace}}/{kind.resource}"
            add("GET", collection, partial(self._list, kind))
            add("POST", collection, partial(self._create, kind))
            add("DELETE", collection, partial(self._delete_collection, kind))
            item = collection + "/{name}"
            add("GET", item, partial(self._get, kind))
            add("PUT", item, partial(self._replace, kind, ""))
            add("PATCH", item, partial(self._patch, kind, ""))
            add("DELETE", item, partial(self._delete_object, kind))
        status = f"{group}/namespaces/{{namespace}}/resourceclaims/{{name}}/status"
        add("GET", status, partial(self._get, RESOURCE_CLAIMS))
        add("PUT", status, partial(self._replace, RESOURCE_CLAIMS, "status"))
        add("PATCH", status, partial(self._patch, RESOURCE_CLAIMS, "status"))

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        content_type = request.content_type if request.can_read_body else ""
        self.log.append((request.method, request.path_qs, content_type))
        self.requests[_verb(request)] += 1
        authorization = request.headers.get("Authorization", "")
        client = self.tokens.get(authorization.removeprefix("Bearer ")) if authorization else None
        if self.token and authorization != f"Bearer {self.token}" and client is None:
            return ApiError(401, "Unauthorized").response()
        if client is None:
            return await self._authorized(request, handler)
        self.client_reads(client).requests += 1
        asker = _Asker(client)
        token = _ASKER.set(asker)
        try:
            response = await self._authorized(request, handler)
        finally:
            _ASKER.reset(token)
        if not asker.counted:
            self._count_answer(client, request, response)
        return response

    async def _authorized(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        for hold in list(self.holds):
            if hold.method == request.method and hold.path.search(request.path_qs):
                self.holds.remove(hold)
                hold.arrived.set()
                await hold.release.wait()
                break
        if self.chaos is not None and (drawn := await self.chaos(request)) is not None:
            return await self._faulted(drawn, request, handler)
        for fault in self.faults:
            if fault.method == request.method and fault.path.search(request.path_qs):
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
                return await self._faulted(fault, request, handler)
        return await self._serve(request, handler)

    # -- what each client read -------------------------------------------------------------

    def client_token(self, client: str) -> str:
        """A bearer token of its own for ``client`` (``<token>-<client>``), accepted from
        now on; what is sent on it is counted for ``client``."""
        token = f"{self.token or 'token'}-{client}"
        self.tokens[token] = client
        return token

    def client_reads(self, client: str) -> ClientReads:
        return self.reads.setdefault(client, ClientReads())

    def claim_bytes_read(self, client: str) -> tuple[int, int]:
        """(own, foreign): bytes of ResourceClaims sent to ``client`` (see :class:`ClientReads`)."""
        reads = self.reads.get(client) or ClientReads()
        return reads.own, reads.foreign

    def _count_claim(self, client: str, claim: Obj, size: int, *, watched: bool = False) -> None:
        reads = self.client_reads(client)
        nodes = self._claim_nodes.get(str(claim.get("metadata", {}).get("uid")), set())
        if client in nodes or client in allocation_nodes(claim):
            reads.own += size
        else:
            reads.foreign += size
        if watched:
            reads.watch_claim_bytes += size

    def _count_line(self, client: str, resource: str, obj: Obj | None, line: bytes) -> None:
        """A watch event line sent to ``client``."""
        self.client_reads(client).watch_bytes += len(line)
        if resource == RESOURCE_CLAIMS.resource and obj is not None and "spec" in obj:
            self._count_claim(client, obj, len(line), watched=True)

    def _claim_size(self, item: Obj) -> int:
        """The bytes of one claim as a list item (encoded once per resourceVersion)."""
        meta = item.get("metadata") or {}
        uid, version = str(meta.get("uid")), str(meta.get("resourceVersion"))
        cached = self._claim_sizes.get(uid)
        if cached is None or cached[0] != version:
            cached = (version, len(json.dumps(item).encode()))
            self._claim_sizes[uid] = cached
        return cached[1]

    def _count_answer(
        self, client: str, request: web.Request, response: web.StreamResponse
    ) -> None:
        """The claims in a (non-watch) answer to ``client``: one object, or a list's items."""
        if (
            "/resourceclaims" not in request.path
            or not isinstance(response, web.Response)
            or response.status >= 300
            or not isinstance(response.body, bytes)
        ):
            return
        body = json.loads(response.body)
        if not isinstance(body, dict):
            return
        if isinstance(body.get("items"), list):
            for item in body["items"]:
                self._count_claim(client, item, self._claim_size(item))
        elif "spec" in body:
            self._count_claim(client, body, len(response.body))

    def _note_allocation(self, claim: Obj) -> None:
        if nodes := allocation_nodes(claim):
            uid = str(claim["metadata"].get("uid"))
            self._claim_nodes.setdefault(uid, set()).update(nodes)

    async def _faulted(
        self, fault: Fault, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """The request as ``fault`` says: served first if it landed (its answer dropped),
        then held if it hangs, then answered with the fault's status or a broken
        connection."""
        if fault.landed:
            await self._serve(request, handler)
        if fault.hang:  # until the client goes: its handler is cancelled then
            self.hanging += 1
            try:
                await asyncio.sleep(HANG_S)
            finally:
                self.hanging -= 1
        if fault.status == 0 or fault.hang:
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=500)  # never sent: the connection is gone
        return ApiError(fault.status, fault.message, fault.reason).response()

    async def _serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The handler's answer, with a ``Warning`` header for each warning it earned."""
        call = Call(request.query.get("fieldValidation") or self.field_validation)
        token = _CALL.set(call)
        try:
            response = await self._answer(request, handler)
        finally:
            _CALL.reset(token)
        if not response.prepared:
            for warning in call.warnings:
                response.headers.add("Warning", f"299 - {json.dumps(warning)}")
        return response

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except web.HTTPNotFound:
            return ApiError(404, "the server could not find the requested resource").response()
        except web.HTTPMethodNotAllowed:
            return ApiError(
                405, f"the server does not allow this method: {request.method}"
            ).response()
        except Exception as exc:  # a bug of the stand-in: say so in the server's format
            log.exception("stand-in API server failed on %s %s", request.method, request.path)
            return ApiError(500, f"stand-in failure: {exc!r}").response()

    # -- the store -------------------------------------------------------------------------

    def _find(self, kind: Kind, namespace: str, name: str) -> Obj:
        found = self.objects[kind.resource].get((namespace if kind.namespaced else "", name))
        if found is None:
            raise not_found(kind.resource, name, kind.group)
        return found

    def _admit(self, kind: Kind, obj: Obj, old: Obj | None) -> None:
        """A write of a resource.k8s.io object, as the real server takes it: decoded (a 400 for
        a wrong type, a quantity or time that does not parse; unknown fields refused, dropped
        with a warning or dropped, as ``fieldValidation`` says), then validated (a 422 naming
        every field in error)."""
        call = _CALL.get(None) or Call(self.field_validation)
        if call.field_validation not in FIELD_VALIDATIONS:
            listed = ", ".join(FIELD_VALIDATIONS)
            raise ApiError(
                400, f"fieldValidation must be one of {listed}, not {call.field_validation!r}"
            )
        report = schema_report(self.kube_version, kind, obj)
        if report.undecodable:
            raise ApiError(400, report.undecodable[0])
        _drop_unknown(obj, report.unknown, call)
        errors = _dedupe(_CHECKS[kind.resource](obj, old) + report.invalid)
        if errors:
            raise invalid_object(kind, obj["metadata"].get("name", ""), errors)

    def _admit_new(self, kind: Kind, obj: Obj, keep_status: bool) -> None:
        """A new resource.k8s.io object: generation 1, a claim's status dropped (unless
        ``keep_status``), then :meth:`_admit`."""
        if kind is RESOURCE_CLAIMS and not keep_status:
            obj["status"] = {}
        obj["metadata"]["generation"] = 1
        self._admit(kind, obj, None)

    def _generated_name(self, kind: Kind, namespace: str, prefix: str) -> str:
        """``generateName`` + 5 characters of the server's alphabet, a name not taken."""
        while True:
            suffix = "".join(secrets.choice(_GENERATED_ALPHABET) for _ in range(5))
            name = prefix[:_GENERATED_PREFIX_MAX] + suffix
            if (namespace, name) not in self.objects[kind.resource]:
                return name

    def _commit(self, kind: Kind, change_type: str, obj: Obj, old: Obj | None = None) -> Obj:
        """Store one write under the next resourceVersion; send it to the watchers."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if change_type == "DELETED":
            self.objects[kind.resource].pop(key, None)
        else:
            self.objects[kind.resource][key] = obj
        if len(self.history) == self.history.maxlen:
            self.floor = self.history[0].version
        change = Change(self.version, kind.resource, change_type, _copy(obj), old)
        self.history.append(change)
        if kind is RESOURCE_CLAIMS:
            self._note_allocation(change.obj)
        for watcher in self.watchers:
            if (event := _event_for(watcher, change)) is not None:
                line = _line(event, change)
                watcher.queue.put_nowait(line)
                if watcher.client:
                    self._count_line(watcher.client, kind.resource, change.obj, line)
        return _copy(obj)

    def _insert(self, kind: Kind, namespace: str, body: Any, *, keep_status: bool = False) -> Obj:
        """A create. The real server drops a new ResourceClaim's ``status``; with
        ``keep_status`` (a test's object put in place) it stays."""
        if not isinstance(body, dict):
            raise ApiError(400, f"the object provided is not a {kind.kind}")
        obj = _copy(body)
        obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
        meta = obj.setdefault("metadata", {})
        if kind.namespaced and meta.setdefault("namespace", namespace) != namespace:
            raise ApiError(400, NAMESPACE_MISMATCH)
        if not kind.namespaced:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generated_name(kind, namespace, meta["generateName"])
        name = meta.get("name", "")
        if not name or not _NAME.match(name):
            why = "Required value: name or generateName is required" if not name else "Invalid"
            raise ApiError(422, f'{kind.kind} "{name}" is invalid: metadata.name: {why}')
        if kind.checked and self._unchecked:
            meta["generation"] = 1
        elif kind.checked:
            self._admit_new(kind, obj, keep_status)
        if (meta.get("namespace", ""), name) in self.objects[kind.resource]:
            details = {"name": name, **({"group": kind.group} if kind.group else {})}
            message = f'{kind.qualified} "{name}" already exists'
            raise ApiError(409, message, "AlreadyExists", {**details, "kind": kind.resource})
        if kind is PODS:
            if not (obj.get("spec") or {}).get("containers"):
                raise ApiError(422, f'Pod "{name}" is invalid: spec.containers: Required value')
            default_pod(obj)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=timestamp())
        meta.pop("deletionTimestamp", None)
        return self._commit(kind, "ADDED", obj)

    def _update(self, kind: Kind, stored: Obj, new: Obj) -> Obj:
        """Write ``new`` over ``stored`` (no-op writes are skipped); delete an object being
        deleted once its finalizers are gone. resource.k8s.io objects are checked first."""
        meta, old_meta = new["metadata"], stored["metadata"]
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if kind.checked:
            self._admit(kind, new, stored)
            changed = new.get("spec") != stored.get("spec")
            meta["generation"] = old_meta.get("generation", 1) + int(changed)
        if new == stored:
            return _copy(stored)
        if old_meta.get("deletionTimestamp") and not (meta.get("finalizers") or []):
            return self._commit(kind, "DELETED", stored, _copy(stored))
        return self._commit(kind, "MODIFIED", new, _copy(stored))

    # -- handlers --------------------------------------------------------------------------

    async def _list(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        q = request.query
        namespace = request.match_info.get("namespace", "")
        selector = _selector(kind, q)
        if _flag(q.get("watch")):
            return await self._watch(kind, namespace, selector, request)
        limit = _int(q.get("limit") or "0", "limit")
        start, revision = self._list_start(q, limit)
        chosen = sorted(
            (_list_key(key, namespace), obj)
            for key, obj in self._state_at(kind, revision, start).items()
            if (not namespace or key[0] == namespace) and selector.matches(obj)
        )
        after = [(key, obj) for key, obj in chosen if key >= start] if start else chosen
        page = after[:limit] if limit > 0 else after
        # serialized before anything can change them: no copies needed
        listing = self._list_of(kind, (obj for _, obj in page), revision or self.version)
        if len(page) < len(after):  # more: the next page from just after this one's last key
            meta = listing["metadata"]
            meta["continue"] = encode_continue(page[-1][0] + "\x00", revision or self.version)
            if selector == Selector():  # unknown with a selector, as on the real server
                meta["remainingItemCount"] = len(after) - len(page)
        if kind is RESOURCE_CLAIMS and (asker := _ASKER.get()) is not None:
            for item in listing["items"]:
                self._count_claim(asker.client, item, self._claim_size(item))
            asker.counted = True
        return web.json_response(listing)

    def _list_start(self, q: Mapping[str, str], limit: int) -> tuple[str, int]:
        """(the key a list starts at, "" for the first; the revision it reads, 0 for the
        current state), from its ``continue``, ``resourceVersion`` and
        ``resourceVersionMatch``, as the real server's storage reads them."""
        version = q.get("resourceVersion", "")
        if token := q.get("continue", ""):
            start, revision = decode_continue(token)
            if version not in ("", "0"):
                raise ApiError(
                    400, "specifying resource version is not allowed when using continue"
                )
            return start, max(revision, 0)  # -1: an inconsistent token, the latest state
        if version in ("", "0"):
            return "", 0
        wanted = _int(version, "resourceVersion")
        if wanted > self.version:
            raise ApiError(504, f"Too large resource version: {wanted}, current: {self.version}")
        match = q.get("resourceVersionMatch", "")
        if match == "Exact" or (match == "" and limit > 0):  # the legacy paged case: exact
            return "", wanted
        return "", 0  # NotOlderThan: the current state is not older

    def _state_at(self, kind: Kind, revision: int, start: str = "") -> dict[Key, Obj]:
        """The objects of ``kind`` as they were at ``revision`` (0 or the current one: as
        they are), rebuilt from the history; 410 Expired when it was compacted away (a
        continue token's: with a token that goes on from ``start`` in the latest state)."""
        stored = self.objects[kind.resource]
        if not revision or revision == self.version:
            return stored
        if revision < self.floor:
            if start:
                token = encode_continue(start, -1)
                raise ApiError(410, EXPIRED_CONTINUE, meta={"continue": token})
            raise ApiError(410, f"too old resource version: {revision} ({self.floor + 1})")
        state = dict(stored)
        for change in reversed(self.history):
            if change.version <= revision:
                break
            if change.resource != kind.resource:
                continue
            key = (change.obj["metadata"].get("namespace", ""), change.obj["metadata"]["name"])
            if change.type == "ADDED":
                state.pop(key, None)
            elif change.old is not None:
                state[key] = change.old
        return state

    def _matching(self, kind: Kind, namespace: str, selector: Selector) -> list[Obj]:
        """The stored objects in ``namespace`` (all: "") that ``selector`` selects, in
        (namespace, name) order."""
        return [
            obj
            for (ns, _), obj in sorted(self.objects[kind.resource].items())
            if (not namespace or ns == namespace) and selector.matches(obj)
        ]

    def _list_of(self, kind: Kind, objects: Iterable[Obj], version: int = 0) -> Obj:
        """A ``<Kind>List`` (its items have no kind/apiVersion) at ``version`` (0: the
        current one)."""
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(version or self.version)},
            "items": [
                {k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in objects
            ],
        }

    async def _watch(
        self, kind: Kind, namespace: str, selector: Selector, request: web.Request
    ) -> web.StreamResponse:
        q = request.query
        timeout_s = float(_int(q.get("timeoutSeconds", "0"), "timeoutSeconds")) or 1800.0
        client = asker.client if (asker := _ASKER.get()) is not None else ""
        watcher = Watcher(
            kind, namespace, selector, _flag(q.get("allowWatchBookmarks")), client=client
        )
        version = q.get("resourceVersion", "")
        backlog: list[bytes] = []
        if version in ("", "0"):
            for obj in self._matching(kind, namespace, selector):
                backlog.append(_encoded({"type": "ADDED", "object": obj}))
                if client:
                    self._count_line(client, kind.resource, obj, backlog[-1])
        elif (since := _int(version, "resourceVersion")) < self.floor:
            message = f"too old resource version: {since} ({self.floor + 1})"
            backlog.append(
                _encoded({"type": "ERROR", "object": status_body(410, "Expired", message)})
            )
            timeout_s = 0.0  # and the stream ends
        else:
            for change in (c for c in self.history if c.version > since):
                if (event := _event_for(watcher, change)) is not None:
                    backlog.append(_line(event, change))
                    if client:
                        self._count_line(client, kind.resource, change.obj, backlog[-1])
        if timeout_s:
            self.watchers.add(watcher)  # before any await: no change falls between
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        # the stream's end, at its timeout: one timer, not one per event
        ending = asyncio.get_running_loop().call_later(timeout_s, watcher.queue.put_nowait, None)
        try:
            await response.prepare(request)
            if backlog:
                await response.write(b"".join(backlog))
            while True:
                lines = [await watcher.queue.get()]
                while lines[-1] is not None and not watcher.queue.empty():
                    lines.append(watcher.queue.get_nowait())  # what queued meanwhile: one write
                sent = [line for line in lines if line is not None]
                if sent:
                    await response.write(b"".join(sent))
                if lines[-1] is None:
                    break
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went
        finally:
            ending.cancel()
            self.watchers.discard(watcher)
        return response

    async def _get(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        return web.json_response(self._find(kind, m.get("namespace", ""), m["name"]))

    async def _create(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        return web.json_response(
            self._insert(kind, request.match_info.get("namespace", ""), body), status=201
        )

    async def _replace(
        self, kind: Kind, subresource: str, request: web.Request
    ) -> web.StreamResponse:
        """PUT: the whole object; a ``metadata.resourceVersion`` other than the stored one
        is a 409 (none: an unconditional update, as these kinds allow). The main resource
        keeps the stored ``status``; ``/status`` takes only ``status``."""
        m = request.match_info
        name, namespace = m["name"], m.get("namespace", "")
        body = await _json(request)
        stored = self._find(kind, namespace, name)
        meta = body.get("metadata") if isinstance(body, dict) else None
        if not isinstance(meta, dict):
            raise ApiError(422, f'{kind.kind} "{name}" is invalid: metadata: Required value')
        if meta.get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        if kind.namespaced and meta.get("namespace", namespace) != namespace:
            raise ApiError(400, NAMESPACE_MISMATCH)
        version = meta.get("resourceVersion")
        if version and version != stored["metadata"]["resourceVersion"]:
            raise conflict(kind.qualified, name, MODIFIED_WHY)
        _check_preconditions(kind, stored, {"uid": meta.get("uid")})
        new = _copy(body)
        if kind.namespaced:
            new["metadata"]["namespace"] = namespace
        else:
            new["metadata"].pop("namespace", None)
        new = _with_subresource(kind, stored, new, subresource)
        return web.json_response(self._update(kind, stored, new))

    async def _patch(
        self, kind: Kind, subresource: str, request: web.Request
    ) -> web.StreamResponse:
        m = request.match_info
        body = await _json(request)
        return web.json_response(
            self._patch_object(
                kind, m.get("namespace", ""), m["name"], request.content_type, body, subresource
            )
        )

    def _patch_object(
        self, kind: Kind, namespace: str, name: str, content_type: str, patch: Any, sub: str
    ) -> Obj:
        stored = self._find(kind, namespace, name)
        patched = apply_patch(content_type, _copy(stored), patch)
        meta = patched.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(422, f'{kind.kind} "{name}" is invalid: metadata: Required value')
        version = meta.get("resourceVersion")
        if version and version != stored["metadata"]["resourceVersion"]:
            raise conflict(kind.qualified, name, MODIFIED_WHY)
        for key in ("name", "namespace"):
            if meta.get(key, "") != stored["metadata"].get(key, ""):
                raise ApiError(400, f"the {key} of the object does not match the {key} on the URL")
        if meta.get("uid", stored["metadata"]["uid"]) != stored["metadata"]["uid"]:
            raise ApiError(
                422, f'{kind.kind} "{name}" is invalid: metadata.uid: field is immutable'
            )
        new = _with_subresource(kind, stored, patched, sub)
        if kind is PODS:
            _check_pod_update(stored, new)
        return self._update(kind, stored, new)

    async def _delete_object(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        """DELETE of one object (not a pod): ``preconditions`` (uid, resourceVersion) in the
        DeleteOptions body are 409s when they do not match."""
        m = request.match_info
        options = await _delete_options(request)
        stored = self._find(kind, m.get("namespace", ""), m["name"])
        _check_preconditions(kind, stored, options.get("preconditions") or {})
        return web.json_response(self._remove(kind, stored))

    async def _delete_daemon_set(self, request: web.Request) -> web.StreamResponse:
        """DELETE of a DaemonSet, its DeleteOptions recorded. ``propagationPolicy``
        Foreground leaves it marked with the finalizer ``foregroundDeletion`` (no garbage
        collector here removes it); Background, Orphan or none delete it at once."""
        m = request.match_info
        options = await _delete_options(request)
        self.deletions.append((request.path, options))
        stored = self._find(DAEMON_SETS, m["namespace"], m["name"])
        _check_preconditions(DAEMON_SETS, stored, options.get("preconditions") or {})
        policy = options.get("propagationPolicy") or request.query.get("propagationPolicy")
        if policy == "Foreground" and not stored["metadata"].get("deletionTimestamp"):
            stored = _copy(stored)
            stored["metadata"]["finalizers"] = ["foregroundDeletion"]
        return web.json_response(self._remove(DAEMON_SETS, stored))

    async def _delete_collection(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        """DELETE on a list path (what the kubelet does to a node's ResourceSlices): every
        selected object; the answer lists them as deleted (or marked, with finalizers)."""
        await _delete_options(request)
        selector = _selector(kind, request.query)
        chosen = self._matching(kind, request.match_info.get("namespace", ""), selector)
        return web.json_response(self._list_of(kind, [self._remove(kind, o) for o in chosen]))

    def _remove(self, kind: Kind, stored: Obj) -> Obj:
        """Delete ``stored`` now, or, while it has finalizers, mark it (``deletionTimestamp``)
        until a write empties them."""
        meta = stored["metadata"]
        if not meta.get("finalizers"):
            return self._commit(kind, "DELETED", stored, _copy(stored))
        if meta.get("deletionTimestamp"):
            return _copy(stored)
        new = _copy(stored)
        new["metadata"].update(deletionTimestamp=timestamp(), deletionGracePeriodSeconds=0)
        return self._commit(kind, "MODIFIED", new, _copy(stored))

    async def _delete_pod(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        body = await _json(request) if request.can_read_body else {}
        if not isinstance(body, dict):
            raise ApiError(400, "the body is not DeleteOptions")
        grace = request.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        seconds = None if grace is None else _int(str(grace), "gracePeriodSeconds")
        preconditions = body.get("preconditions") or {}
        return web.json_response(self._delete(m["namespace"], m["name"], seconds, preconditions))

    def _delete(
        self, namespace: str, name: str, grace: int | None, preconditions: Mapping[str, str]
    ) -> Obj:
        stored = self._find(PODS, namespace, name)
        meta = stored["metadata"]
        for key in ("uid", "resourceVersion"):
            if preconditions.get(key) and preconditions[key] != meta[key]:
                why = (
                    f"Precondition failed: {key} in precondition: {preconditions[key]}, "
                    f"{key} in object meta: {meta[key]}"
                )
                raise conflict("pods", name, why)
        if grace is None:
            grace = stored["spec"].get("terminationGracePeriodSeconds", 30)
        ended = stored["status"].get("phase") in ("Succeeded", "Failed")
        if ended or not stored["spec"].get("nodeName"):
            grace = 0  # what the real server does for unscheduled and terminated pods
        if not meta.get("finalizers"):
            return self._commit(PODS, "DELETED", stored, _copy(stored))
        if meta.get("deletionTimestamp") and grace >= meta.get("deletionGracePeriodSeconds", 0):
            return _copy(stored)  # being deleted already
        new = _copy(stored)
        new["metadata"].update(deletionTimestamp=timestamp(grace), deletionGracePeriodSeconds=grace)
        return self._commit(PODS, "MODIFIED", new, _copy(stored))

    async def _delete_node(self, request: web.Request) -> web.StreamResponse:
        stored = self._find(NODES, "", request.match_info["name"])
        return web.json_response(self._commit(NODES, "DELETED", stored, _copy(stored)))

    async def _bind(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        name = m["name"]
        body = await _json(request)
        if not isinstance(body, dict) or body.get("kind", "Binding") != "Binding":
            raise ApiError(400, "the object provided is not a Binding")
        meta = body.get("metadata") or {}
        if meta.get("name", name) != name:
            raise ApiError(400, "name in URL does not match name in Binding object")
        target = body.get("target") or {}
        if not target.get("name") or target.get("kind", "Node") != "Node":
            raise ApiError(422, f'Binding "{name}" is invalid: target.name: Required value')
        stored = self._find(PODS, m["namespace"], name)
        uid = stored["metadata"]["uid"]
        if meta.get("uid") and meta["uid"] != uid:
            why = (
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {uid}"
            )
            raise conflict("pods", name, why)
        if stored["metadata"].get("deletionTimestamp"):
            raise conflict(
                "pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        if node := stored["spec"].get("nodeName"):
            raise conflict("pods/binding", name, f'pod {name} is already assigned to node "{node}"')
        new = _copy(stored)
        new["spec"]["nodeName"] = target["name"]
        if annotations := meta.get("annotations"):
            new["metadata"].setdefault("annotations", {}).update(annotations)
        conditions = [
            c for c in new["status"].get("conditions") or [] if c.get("type") != "PodScheduled"
        ]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": timestamp(),
            }
        )
        new["status"]["conditions"] = conditions
        self._commit(PODS, "MODIFIED", new, _copy(stored))
        success = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }
        return web.json_response(success, status=201)

    # -- test helpers ----------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self.version)

    def create_pod(
        self, name: str, namespace: str = "default", *, phase: str = "", **manifest: Any
    ) -> Obj:
        """Create a pod (:func:`pod_manifest`'s arguments) as if POSTed; with ``phase`` it is
        created in that phase (a pod that was running before the test)."""
        pod = pod_manifest(name, namespace, **manifest)
        if not phase:
            return self._insert(PODS, namespace, pod)
        stored = self._insert(PODS, namespace, pod)  # one ADDED, then the kubelet's status
        return self.set_pod_phase(namespace, stored["metadata"]["name"], phase)

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> Obj:
        """What the kubelet writes (``status`` only): MODIFIED."""
        stored = self._find(PODS, namespace, name)
        new = _copy(stored)
        new["status"]["phase"] = phase
        state = _CONTAINER_STATES.get(phase, {"waiting": {"reason": "ContainerCreating"}})
        new["status"]["containerStatuses"] = [
            {"name": c.get("name", ""), "state": _copy(state), "ready": "running" in state}
            for c in (new.get("spec") or {}).get("containers") or []
        ]
        return self._update(PODS, stored, new)

    def patch_pod(
        self,
        namespace: str,
        name: str,
        patch: Any,
        *,
        content_type: str = MERGE_PATCH,
        subresource: str = "",
    ) -> Obj:
        """A PATCH as if sent (same checks, same events), without a round trip; raises
        :class:`ApiError` where the server would answer with an error."""
        return self._patch_object(PODS, namespace, name, content_type, patch, subresource)

    def pod(self, namespace: str, name: str) -> Obj | None:
        found = self.objects["pods"].get((namespace, name))
        return _copy(found) if found else None

    def delete_pod(self, namespace: str, name: str, force: bool = False) -> Obj:
        """``kubectl delete pod`` (``--force --grace-period=0`` with ``force``)."""
        return self._delete(namespace, name, 0 if force else None, {})

    def create_node(
        self, name: str, *, labels: Mapping[str, str] | None = None, ready: bool = True
    ) -> Obj:
        node: Obj = {
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": {},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if ready else "False",
                        "reason": "KubeletReady",
                    },
                    {
                        "type": "MemoryPressure",
                        "status": "False",
                        "reason": "KubeletHasSufficientMemory",
                    },
                ],
                "addresses": [{"type": "Hostname", "address": name}],
            },
        }
        return self._insert(NODES, "", node)

    def node(self, name: str) -> Obj | None:
        found = self.objects["nodes"].get(("", name))
        return _copy(found) if found else None

    def put_object(self, resource: str, obj: Obj) -> Obj:
        """Put ``obj`` in place as a controller would have before the test, ``status``
        included: created (ADDED), or written over the stored one of that name (MODIFIED;
        its uid kept). Checked as the server checks a write: raises :class:`ApiError` where
        it would refuse it. A namespaced object without a namespace goes to ``default``."""
        kind = KINDS[resource]
        meta = obj.get("metadata") or {}
        namespace = (meta.get("namespace") or "default") if kind.namespaced else ""
        stored = self.objects[resource].get((namespace, meta.get("name", "")))
        if stored is None:
            return self._insert(kind, namespace, obj, keep_status=True)
        new = {**_copy(obj), "kind": kind.kind, "apiVersion": kind.api_version}
        new["metadata"] = {**new.get("metadata", {}), "namespace": namespace}
        if not kind.namespaced:
            new["metadata"].pop("namespace")
        return self._update(kind, stored, new)

    def put_objects(self, resource: str, objs: Iterable[Obj], *, check_each: bool = True) -> int:
        """Many objects put in place (as :meth:`put_object` puts each) as though they had
        stood there before every watch began: no watch is sent them one by one; instead
        the history is compacted and every watch ended, so that each client, resuming,
        gets 410 Expired and lists again. Returns how many were put. ``check_each``
        False: only the first is checked against the schemas (the others made alike)."""
        watchers, self.watchers = self.watchers, set()  # no await below: none opens meanwhile
        count = 0
        try:
            for obj in objs:
                self.put_object(resource, obj)
                count += 1
                self._unchecked = not check_each
        finally:
            self.watchers = watchers
            self._unchecked = False
        self.compact()
        self.end_watches()
        return count

    def delete_object(self, resource: str, namespace: str, name: str) -> Obj:
        """Delete as a DELETE without options does (a pod: with its grace period; any other
        object at once, or marked while it has finalizers)."""
        kind = KINDS[resource]
        if kind is PODS:
            return self._delete(namespace, name, None, {})
        return self._remove(kind, self._find(kind, namespace if kind.namespaced else "", name))

    def events_for(self, pod_name: str, namespace: str = "") -> list[Obj]:
        """The events about ``pod_name``, in the order they were created."""
        found = [
            e
            for e in self.objects["events"].values()
            if (e.get("involvedObject") or {}).get("name") == pod_name
            and (not namespace or e["metadata"]["namespace"] == namespace)
        ]
        return sorted(
            (_copy(e) for e in found), key=lambda e: int(e["metadata"]["resourceVersion"])
        )

    def set_endpoints(
        self,
        namespace: str,
        service: str,
        endpoints: Iterable[tuple[str, str]],
        *,
        port: int,
        port_name: str = "grpc",
        ready: bool = True,
    ) -> Obj:
        """Replace the Service's one EndpointSlice: ``endpoints`` are (node name, address)."""
        name = f"{service}-{secrets.token_hex(3)[:5]}"
        for (ns, old_name), old in list(self.objects["endpointslices"].items()):
            if (
                ns == namespace
                and old["metadata"]["labels"].get("kubernetes.io/service-name") == service
            ):
                name = old_name
                self._commit(SLICES, "DELETED", old, _copy(old))
        slice_: Obj = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
            },
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [address],
                    "conditions": {"ready": ready, "serving": ready, "terminating": False},
                    "nodeName": node,
                    "targetRef": {
                        "kind": "Pod",
                        "namespace": namespace,
                        "name": f"{service}-{node}",
                    },
                }
                for node, address in endpoints
            ],
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        }
        return self._insert(SLICES, namespace, slice_)

    def compact(self) -> None:
        """Forget the history, as etcd's compaction does: older watches get 410 Expired."""
        self.history.clear()
        self.floor = self.version

    def bookmark(self) -> None:
        """Send a BOOKMARK (the current resourceVersion) to every watch that asked for them."""
        for watcher in self.watchers:
            if watcher.bookmarks:
                obj = {
                    "kind": watcher.kind.kind,
                    "apiVersion": watcher.kind.api_version,
                    "metadata": {"resourceVersion": str(self.version)},
                }
                line = _encoded({"type": "BOOKMARK", "object": obj})
                watcher.queue.put_nowait(line)
                if watcher.client:
                    self._count_line(watcher.client, watcher.kind.resource, None, line)

    def hold_next(self, method: str, path_regex: str) -> Hold:
        """Hold the next request whose method and path (with its query) match until the
        returned hold's ``release`` is set."""
        hold = Hold(method.upper(), re.compile(path_regex))
        self.holds.append(hold)
        return hold

    def end_watches(self) -> None:
        """End every open watch stream, as the server does at ``timeoutSeconds``."""
        for watcher in list(self.watchers):
            watcher.queue.put_nowait(None)

    def fail_next(
        self,
        method: str,
        path_regex: str,
        status: int = 0,
        *,
        reason: str = "",
        message: str = "injected failure",
        times: int = 1,
        landed: bool = False,
        hang: bool = False,
    ) -> Fault:
        """Answer the next ``times`` requests whose method and path (with its query,
        searched) match with this status and a ``Status`` body; 0 breaks the connection
        (aiohttp clients send an idempotent request again, once, when a reused connection
        breaks: ``times=2`` makes such a GET fail).

        ``landed``: the request is served first, its change made (a write that landed),
        and only its answer is the fault's: a 5xx, a broken connection, or a hang.
        ``hang``: no answer at all; the request is held until the client gives up (its
        timeout) and closes the connection, or for :data:`HANG_S`, then the connection
        breaks (``status`` is not used). Without ``landed`` nothing was done."""
        fault = Fault(
            method.upper(),
            re.compile(path_regex),
            status,
            reason,
            message,
            times,
            landed=landed,
            hang=hang,
        )
        self.faults.append(fault)
        return fault


def _check_pod_update(stored: Obj, new: Obj) -> None:
    name = stored["metadata"]["name"]
    if _pod_spec_frozen(new.get("spec") or {}) != _pod_spec_frozen(stored["spec"]):
        raise ApiError(
            422,
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other '
            "than `spec.containers[*].image`, `spec.initContainers[*].image`, "
            "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
            "tolerations), `spec.terminationGracePeriodSeconds`",
        )
    if stored["metadata"].get("deletionTimestamp"):
        added = set(new["metadata"].get("finalizers") or []) - set(
            stored["metadata"].get("finalizers") or []
        )
        if added:
            raise ApiError(
                422,
                f'Pod "{name}" is invalid: metadata.finalizers: Forbidden: no new finalizers can '
                f"be added if the object is being deleted, found new finalizers {sorted(added)}",
            )


def allocation_nodes(claim: Obj) -> set[str]:
    """The nodes a claim's allocation names (``nodeSelector`` matchFields on
    ``metadata.name`` with ``In``); none for an unallocated claim."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    return {
        value
        for term in terms
        for match in term.get("matchFields") or []
        if match.get("key") == "metadata.name" and match.get("operator") == "In"
        for value in match.get("values") or []
    }


def _verb(request: web.Request) -> str:
    method = request.method
    named = "name" in request.match_info
    if method == "GET":
        if _flag(request.query.get("watch")):
            return "watch"
        return "get" if named else "list"
    if method == "DELETE" and not named:
        return "deletecollection"
    return {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}.get(
        method, method.lower()
    )


NAMESPACE_MISMATCH = (
    "the namespace of the provided object does not match the namespace sent on the request"
)
_GENERATED_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the server's: no vowels, no 0, 1, 3
_GENERATED_PREFIX_MAX = 58  # 63 - 5: the server cuts a longer generateName


class Store(dict[str, dict[Key, Obj]]):
    """The stored objects: by resource, then by (namespace, name) (namespace "" for a
    cluster-scoped kind). Called with a resource (and a namespace), copies of its objects in
    (namespace, name) order: ``api.objects("resourceclaims")``."""

    def __call__(self, resource: str, namespace: str | None = None) -> list[Obj]:
        chosen = (
            (key, obj)
            for key, obj in self[resource].items()
            if namespace is None or key[0] == namespace
        )
        return [_copy(obj) for _, obj in sorted(chosen, key=lambda pair: pair[0])]


def _selector(kind: Kind, query: Mapping[str, str]) -> Selector:
    fields, labels = query.get("fieldSelector", ""), query.get("labelSelector", "")
    return Selector.parse(fields, labels, kind.fields, kind.refusal)


def _check_preconditions(kind: Kind, stored: Obj, preconditions: Mapping[str, Any]) -> None:
    """A 409 for a ``uid`` or ``resourceVersion`` precondition ``stored`` does not meet."""
    meta = stored["metadata"]
    for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = preconditions.get(key)
        if wanted and wanted != meta.get(key):
            why = (
                f"Precondition failed: {label} in precondition: {wanted}, "
                f"{label} in object meta: {meta.get(key)}"
            )
            raise conflict(kind.qualified, meta["name"], why)


def _with_subresource(kind: Kind, stored: Obj, written: Obj, subresource: str) -> Obj:
    """What a write to the main resource (``written`` but the stored status) or to
    ``/status`` (the stored object but ``written``'s status) stores."""
    if subresource == "status":
        new = {**_copy(stored), "status": written.get("status") or {}}
    else:
        new = {**written, "status": _copy(stored.get("status") or {})}
        if "status" not in stored:
            new.pop("status")
    new["kind"], new["apiVersion"] = kind.kind, kind.api_version
    return new


def _drop_unknown(obj: Obj, unknown: list[tuple[tuple[Any, ...], str]], call: Call) -> None:
    """Fields the schema does not know: a 400 (Strict), or dropped, with a warning (Warn)."""
    if not unknown:
        return
    named = [f'unknown field "{field_path((*path, key))}"' for path, key in unknown]
    if call.field_validation == "Strict":
        raise ApiError(400, f"strict decoding error: {', '.join(named)}")
    for path, key in unknown:
        parent: Any = obj
        for part in path:
            parent = parent[part]
        parent.pop(key, None)
    if call.field_validation == "Warn":
        call.warnings += named


async def _delete_options(request: web.Request) -> Obj:
    body = await _json(request) if request.can_read_body else {}
    if not isinstance(body, dict):
        raise ApiError(400, "the body is not DeleteOptions")
    return body


def _flag(text: str | None) -> bool:
    """A boolean query parameter, as Go's strconv.ParseBool reads it."""
    return text in ("1", "t", "T", "true", "TRUE", "True")


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ApiError(400, f"invalid {what}: {text!r}") from None


# -- lists in pages (``limit`` and ``continue``) --------------------------------------------

CONTINUE_VERSION = "meta.k8s.io/v1"
_INVALID_CONTINUE = "invalid continue token: continue key is not valid"
EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You "
    "can start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)


def _list_key(key: Key, namespace: str) -> str:
    """An object's storage key below the list's prefix (etcd's order is this string's): its
    name in one namespace or cluster-scoped, ``namespace/name`` across namespaces."""
    ns, name = key
    return name if namespace or not ns else f"{ns}/{name}"


def encode_continue(start: str, revision: int) -> str:
    """The real server's continue token: unpadded URL-safe base64 of ``{"v", "rv",
    "start"}``, the key to go on from and the revision every page reads (-1: the latest)."""
    token = json.dumps(
        {"v": CONTINUE_VERSION, "rv": revision, "start": start}, separators=(",", ":")
    )
    return base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode()


def decode_continue(token: str) -> tuple[str, int]:
    """(start key, revision) of a continue token; a 400 for one the server did not make."""
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error) as exc:
        raise ApiError(400, f"{_INVALID_CONTINUE}: {exc}") from None
    if not isinstance(decoded, dict) or decoded.get("v") != CONTINUE_VERSION:
        raise ApiError(400, f"{_INVALID_CONTINUE}: server does not recognize this encoded version")
    revision, start = decoded.get("rv"), decoded.get("start")
    if not isinstance(revision, int) or revision == 0:
        raise ApiError(400, f"{_INVALID_CONTINUE}: incorrect encoded start resourceVersion")
    if not isinstance(start, str) or not start:
        raise ApiError(400, f"{_INVALID_CONTINUE}: encoded start key empty")
    key = start if start.startswith("/") else f"/{start}"
    if posixpath.normpath(key) != key:  # no climbing out of the list's prefix
        raise ApiError(400, f"{_INVALID_CONTINUE}: {start}")
    return key[1:], revision


async def _json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"the request body is not JSON: {exc}") from None
