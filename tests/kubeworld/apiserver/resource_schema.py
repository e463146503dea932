"""resource.k8s.io/v1, the decoding stage: what the strict JSON schemas of
``kubernetes-validate`` say of an object (400s of the decoder, unknown fields, the 422s the
schema can express), and the :class:`FieldError` vocabulary of the server's validation."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jsonschema
from kubernetes_validate import utils as schemas
from referencing import Registry, Resource

from tests.kubeworld.apiserver.errors import ApiError
from tests.kubeworld.apiserver.objects import Kind, Obj
from tests.kubeworld.quantity import FORMAT_MESSAGE as QUANTITY_FORMAT
from tests.kubeworld.quantity import QuantityError, parse_quantity

_QUANTITY_DEF = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_MAP_FIELDS = frozenset(
    {"annotations", "attributes", "capacity", "consumedCapacity", "counters", "labels"}
    | {"nodeAllocatableResourceMappings", "nodeAllocatableResources", "requests"}
)  # their keys are shown as [key] in field paths, as Go's field.Path.Key does
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
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


def dedupe(errors: list[FieldError]) -> list[FieldError]:
    """One error per field and type: the first (the server's checks come before the
    schema's plainer ``Required value``)."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for error in errors:
        if (error.path, error.type) not in seen:
            seen.add((error.path, error.type))
            kept.append(error)
    return kept
