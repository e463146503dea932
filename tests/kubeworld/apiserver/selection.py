"""Field and label selectors, as the real server reads ``fieldSelector`` and
``labelSelector`` (see the package's text for the forms taken)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.kubeworld.apiserver.errors import ApiError


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
