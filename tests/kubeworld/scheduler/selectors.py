"""The few CEL device-selector forms this stand-in evaluates, joined by ``&&``:

- ``device.driver == "gpushare.io"`` (or ``!=``)
- ``device.allowMultipleAllocations == true`` (or ``!=``, ``false``)
- ``device.attributes["gpushare.io"].sharingMode == "mps"`` (or ``!=``); the literal is a
  string, an int, ``true``/``false`` or ``semver("1.2.3")``; values of different types
  are unequal (CEL's heterogeneous equality)
- ``device.capacity["gpushare.io"].memory.compareTo(quantity("8Gi")) >= 0`` (any of
  ``== != >= <= > <`` against an int)

Anything else is refused when compiled (:class:`UnsupportedSelector`). As in CEL, a domain
the device lacks is an empty map and a name missing from it is a runtime error ("no such
key"), which fails the allocation (:class:`SelectorRuntimeError`), as the real allocator's
CEL runtime errors do."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.kubeworld.quantity import Quantity, QuantityError

Value = tuple[str, Any]  # (type, value): ("string", "mps"), ("int", 3), ("version", "9.0.0")
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_STRING = r'"([^"\\]*)"|\'([^\'\\]*)\''
_DOMAIN = rf"\[\s*(?:{_STRING})\s*\]"
_DRIVER = re.compile(rf"^device\.driver\s*(==|!=)\s*(?:{_STRING})$")
_MULTI = re.compile(r"^device\.allowMultipleAllocations\s*(==|!=)\s*(true|false)$")
_ATTRIBUTE = re.compile(rf"^device\.attributes{_DOMAIN}\.([A-Za-z_]\w*)\s*(==|!=)\s*(.+)$")
_CAPACITY = re.compile(
    rf"^device\.capacity{_DOMAIN}\.([A-Za-z_]\w*)\.compareTo\(\s*quantity\(\s*(?:{_STRING})\s*\)"
    r"\s*\)\s*(==|!=|>=|<=|>|<)\s*(-?\d+)$"
)
_SEMVER = re.compile(rf"^semver\(\s*(?:{_STRING})\s*\)$")
SUPPORTED = (
    'device.driver == "..."; device.allowMultipleAllocations == true|false; '
    'device.attributes["<domain>"].<name> ==|!= <literal>; '
    'device.capacity["<domain>"].<name>.compareTo(quantity("...")) <op> <int>; joined by &&'
)


class UnsupportedSelector(ValueError):
    pass


class SelectorRuntimeError(ValueError):
    pass


@dataclass(frozen=True)
class DeviceView:
    """What a selector sees of a device: attributes and capacities grouped by domain (a
    short name is in the driver's domain)."""

    driver: str
    multiple: bool
    attributes: Mapping[str, Mapping[str, Value]]
    capacity: Mapping[str, Mapping[str, Quantity]]

    @classmethod
    def of(cls, driver: str, device: Mapping[str, Any]) -> DeviceView:
        attributes: dict[str, dict[str, Value]] = {}
        for name, typed in (device.get("attributes") or {}).items():
            domain, short = split_name(name, driver)
            kind, value = next(iter(typed.items()))
            attributes.setdefault(domain, {})[short] = (kind, value)
        capacity: dict[str, dict[str, Quantity]] = {}
        for name, entry in (device.get("capacity") or {}).items():
            domain, short = split_name(name, driver)
            capacity.setdefault(domain, {})[short] = Quantity.parse(entry["value"])
        multiple = bool(device.get("allowMultipleAllocations"))
        return cls(driver, multiple, attributes, capacity)


Predicate = Callable[[DeviceView], bool]


def split_name(name: str, driver: str) -> tuple[str, str]:
    """``domain/name`` -> (domain, name); a short name is in the driver's domain."""
    domain, _, short = name.rpartition("/")
    return (domain or driver), short


def compile_selector(expression: str) -> Predicate:
    """A predicate for ``expression`` (:class:`UnsupportedSelector` for other CEL)."""
    terms = [_term(t.strip()) for t in _conjuncts(expression)]
    return lambda device: all(term(device) for term in terms)


def _conjuncts(expression: str) -> list[str]:
    """``expression`` split at each ``&&`` outside string literals."""
    parts, start, quote, i = [], 0, "", 0
    while i < len(expression):
        char = expression[i]
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif expression.startswith("&&", i):
            parts.append(expression[start:i])
            start, i = i + 2, i + 1
        i += 1
    parts.append(expression[start:])
    return parts


def _term(term: str) -> Predicate:
    for pattern, build in (
        (_DRIVER, _driver_term),
        (_MULTI, _multi_term),
        (_ATTRIBUTE, _attribute_term),
        (_CAPACITY, _capacity_term),
    ):
        if match := pattern.match(term):
            return build(match)
    raise UnsupportedSelector(f"CEL expression {term!r} is not supported here ({SUPPORTED})")


def _driver_term(match: re.Match[str]) -> Predicate:
    op, name = _COMPARE[match[1]], match[2] or match[3] or ""
    return lambda device: op(device.driver, name)


def _multi_term(match: re.Match[str]) -> Predicate:
    op, wanted = _COMPARE[match[1]], match[2] == "true"
    return lambda device: op(device.multiple, wanted)


def _attribute_term(match: re.Match[str]) -> Predicate:
    domain, name = match[1] or match[2] or "", match[3]
    op, literal = _COMPARE[match[4]], _literal(match[5].strip())
    return lambda device: op(_lookup(device.attributes, domain, name), literal)


def _capacity_term(match: re.Match[str]) -> Predicate:
    domain, name = match[1] or match[2] or "", match[3]
    try:
        bound = Quantity.parse(match[4] or match[5] or "")
    except QuantityError as exc:
        raise UnsupportedSelector(f"quantity(): {exc}") from None
    op, target = _COMPARE[match[6]], int(match[7])

    def test(device: DeviceView) -> bool:
        amount = _lookup(device.capacity, domain, name)
        return op((amount > bound) - (amount < bound), target)

    return test


def _lookup(groups: Mapping[str, Mapping[str, Any]], domain: str, name: str) -> Any:
    found = groups.get(domain, {})
    if name not in found:
        raise SelectorRuntimeError(f"no such key: {name}")
    return found[name]


def _literal(text: str) -> Value:
    if match := re.fullmatch(_STRING, text):
        return ("string", match[1] if match[1] is not None else match[2])
    if re.fullmatch(r"-?\d+", text):
        return ("int", int(text))
    if text in ("true", "false"):
        return ("bool", text == "true")
    if match := _SEMVER.match(text):
        return ("version", match[1] or match[2] or "")
    raise UnsupportedSelector(f"CEL literal {text!r} is not supported here ({SUPPORTED})")
