"""resource.k8s.io/v1, the validation stage past the schema, as k8s.io/kubernetes
pkg/apis/resource/validation checks a write (limits from k8s.io/api/resource/v1 types.go)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from tests.kubeworld.apiserver.objects import Obj
from tests.kubeworld.apiserver.resource_schema import (
    FieldError,
    duplicate,
    field_path,
    forbidden,
    invalid,
    not_supported,
    required,
    too_many,
)
from tests.kubeworld.quantity import integer_value, parse_quantity, render

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


CHECKS: dict[str, Callable[[Obj, Obj | None], list[FieldError]]] = {
    "deviceclasses": class_errors,
    "resourceslices": slice_errors,
    "resourceclaims": claim_errors,
    "resourceclaimtemplates": template_errors,
}
