"""resource.k8s.io/v1: DeviceClasses, ResourceSlices, ResourceClaims (with ``/status``) and
ResourceClaimTemplates, every verb; a write decoded and validated as the real server does
(:mod:`.resource_schema`, :mod:`.resource_rules`) under the request's
``fieldValidation``."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tests.kubeworld.apiserver.errors import ApiError
from tests.kubeworld.apiserver.objects import META_FIELDS, META_REFUSAL, Kind, Obj
from tests.kubeworld.apiserver.resource_rules import CHECKS
from tests.kubeworld.apiserver.resource_schema import (
    dedupe,
    field_path,
    invalid_object,
    schema_report,
)

DRA_VERSION = "resource.k8s.io/v1"
DEVICE_CLASSES = Kind(
    "deviceclasses", "DeviceClass", DRA_VERSION, False, META_FIELDS, META_REFUSAL, True
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
    "resourceclaims", "ResourceClaim", DRA_VERSION, True, META_FIELDS, META_REFUSAL, True
)
CLAIM_TEMPLATES = Kind(
    "resourceclaimtemplates",
    "ResourceClaimTemplate",
    DRA_VERSION,
    True,
    META_FIELDS,
    META_REFUSAL,
    True,
)
DRA_KINDS = (DEVICE_CLASSES, RESOURCE_SLICES, RESOURCE_CLAIMS, CLAIM_TEMPLATES)

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


@dataclass
class Call:
    """What one request asks of the decoder (``fieldValidation``) and the warnings it earns
    (sent as ``Warning`` headers)."""

    field_validation: str
    warnings: list[str] = field(default_factory=list)


CALL: contextvars.ContextVar[Call] = contextvars.ContextVar("fake_apiserver_call")


def drop_unknown(obj: Obj, unknown: list[tuple[tuple[Any, ...], str]], call: Call) -> None:
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


class ResourceV1:
    """The resource.k8s.io/v1 part of :class:`FakeApiServer`: its routes and how a write
    of its kinds is admitted."""

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

    def _admit(self, kind: Kind, obj: Obj, old: Obj | None) -> None:
        """A write of a resource.k8s.io object, as the real server takes it: decoded (a 400 for
        a wrong type, a quantity or time that does not parse; unknown fields refused, dropped
        with a warning or dropped, as ``fieldValidation`` says), then validated (a 422 naming
        every field in error)."""
        call = CALL.get(None) or Call(self.field_validation)
        if call.field_validation not in FIELD_VALIDATIONS:
            listed = ", ".join(FIELD_VALIDATIONS)
            raise ApiError(
                400, f"fieldValidation must be one of {listed}, not {call.field_validation!r}"
            )
        report = schema_report(self.kube_version, kind, obj)
        if report.undecodable:
            raise ApiError(400, report.undecodable[0])
        drop_unknown(obj, report.unknown, call)
        errors = dedupe(CHECKS[kind.resource](obj, old) + report.invalid)
        if errors:
            raise invalid_object(kind, obj["metadata"].get("name", ""), errors)

    def _admit_new(self, kind: Kind, obj: Obj, keep_status: bool) -> None:
        """A new resource.k8s.io object: generation 1, a claim's status dropped (unless
        ``keep_status``), then :meth:`_admit`."""
        if kind is RESOURCE_CLAIMS and not keep_status:
            obj["status"] = {}
        obj["metadata"]["generation"] = 1
        self._admit(kind, obj, None)
