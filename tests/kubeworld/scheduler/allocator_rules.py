"""The allocator stand-in's rules of one device: consumable capacity and its request
policies (R4-R8), taints and tolerations (R11), and the claim's constraints (R10); and
:class:`Candidate`, a device they are asked about."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tests.kubeworld.quantity import BINARY, ZERO, Quantity
from tests.kubeworld.scheduler.selectors import (
    DeviceView,
    split_name,
)

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]  # (driver, pool, device)
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, eq=False)
class Candidate:
    key: DeviceKey
    device: Obj
    view: DeviceView
    node_local: bool

    @property
    def multiple(self) -> bool:
        return bool(self.device.get("allowMultipleAllocations"))


# -- capacity (R4-R8) ----------------------------------------------------------------------


def consumed_amounts(device: Obj, requested: Mapping[str, Quantity]) -> dict[str, Quantity] | None:
    """R4-R6: what serving ``requested`` consumes of each capacity of ``device``, or None
    when it names a capacity the device lacks or an amount breaks a policy."""
    capacity = device.get("capacity") or {}
    if any(name not in capacity for name in requested):
        return None
    amounts: dict[str, Quantity] = {}
    for name, entry in capacity.items():
        policy = entry.get("requestPolicy")
        amount = consumed_amount(requested.get(name), Quantity.parse(entry["value"]), policy)
        if violates_policy(amount, policy):
            return None
        amounts[name] = amount
    return amounts


def consumed_amount(requested: Quantity | None, value: Quantity, policy: Obj | None) -> Quantity:
    """R5."""
    if requested is None:
        default = (policy or {}).get("default")
        return value if default is None else Quantity.parse(default)
    if policy is None:
        return requested
    if (valid := policy.get("validValues")) is not None:
        return next((v for v in map(Quantity.parse, valid) if requested <= v), requested)
    if (span := policy.get("validRange")) is not None and span.get("min") is not None:
        return _round_up(requested, span)
    return requested


def _round_up(requested: Quantity, span: Obj) -> Quantity:
    low = Quantity.parse(span["min"])
    if requested < low:
        return low
    if span.get("step") is None:
        return requested
    step_units, low_units = Quantity.parse(span["step"]).value(), low.value()
    steps = -(-(requested.value() - low_units) // step_units)
    return Quantity.of_units(low_units + steps * step_units, BINARY)


def violates_policy(amount: Quantity, policy: Obj | None) -> bool:
    """R6."""
    if policy is None:
        return False
    if policy.get("default") is not None and amount == Quantity.parse(policy["default"]):
        return False
    if (valid := policy.get("validValues")) is not None:
        return amount not in map(Quantity.parse, valid)
    if (span := policy.get("validRange")) is not None:
        if span.get("max") is not None and amount > Quantity.parse(span["max"]):
            return True
        if span.get("step") is not None:
            off_grid = amount.value() - Quantity.parse(span["min"]).value()
            return off_grid % Quantity.parse(span["step"]).value() != 0
    return False


def fits(device: Obj, amounts: Mapping[str, Quantity], used: Mapping[str, Quantity]) -> bool:
    """R7."""
    capacity = device.get("capacity") or {}
    return all(
        used.get(name, ZERO) + amount <= Quantity.parse(capacity[name]["value"])
        for name, amount in amounts.items()
    )


# -- taints (R11) --------------------------------------------------------------------------


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and toleration.get("value", "") == taint.get("value", "")


def tolerated(device: Obj, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    return all(
        any(tolerates(t, taint) for t in tolerations)
        for taint in device.get("taints") or []
        if taint.get("effect") in BLOCKING_EFFECTS
    )


# -- constraints (R10) ---------------------------------------------------------------------


class Constraint(Protocol):
    def add(self, request: str, candidate: Candidate) -> bool: ...
    def remove(self, request: str, candidate: Candidate) -> None: ...


def lookup_attribute(candidate: Candidate, name: str) -> tuple[str, Any] | None:
    attributes = candidate.device.get("attributes") or {}
    found = attributes.get(name)
    domain, short = split_name(name, "")
    if found is None and domain == candidate.key[0]:
        found = attributes.get(short)
    return None if found is None else next(iter(found.items()))


@dataclass
class MatchAttribute:
    attribute: str
    requests: frozenset[str]
    value: tuple[str, Any] | None = None
    devices: int = 0

    def add(self, request: str, candidate: Candidate) -> bool:
        if self.requests and request not in self.requests:
            return True
        found = lookup_attribute(candidate, self.attribute)
        if found is None or (self.devices and found != self.value):
            return False
        self.value, self.devices = found, self.devices + 1
        return True

    def remove(self, request: str, candidate: Candidate) -> None:
        if self.requests and request not in self.requests:
            return
        self.devices -= 1
        if not self.devices:
            self.value = None


@dataclass
class DistinctAttribute:
    attribute: str
    requests: frozenset[str]
    values: dict[str, tuple[str, Any]] = field(default_factory=dict)  # by request name

    def add(self, request: str, candidate: Candidate) -> bool:
        if self.requests and request not in self.requests:
            return True
        found = lookup_attribute(candidate, self.attribute)
        if found is None or found in self.values.values():
            return False
        self.values[request] = found
        return True

    def remove(self, request: str, candidate: Candidate) -> None:
        if not self.requests or request in self.requests:
            self.values.pop(request, None)


def parse_constraints(claim: Obj) -> list[Constraint]:
    found: list[Constraint] = []
    for entry in claim["spec"].get("devices", {}).get("constraints") or []:
        requests = frozenset(entry.get("requests") or ())
        if entry.get("matchAttribute"):
            found.append(MatchAttribute(entry["matchAttribute"], requests))
        elif entry.get("distinctAttribute"):
            found.append(DistinctAttribute(entry["distinctAttribute"], requests))
    return found
