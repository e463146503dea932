"""The ``gpushare.io/sizing`` annotation: a short YAML or JSON object turned into the
agent's :class:`~agent.admission.sizing.SizingSpec`. Pure: no I/O.

It holds ``parameters`` and ``mode`` (and, for inference, ``dtype``, ``layers``,
``kv_heads``, ``head_dim``, ``context_length``, ``concurrent_sequences``), the agent's Sizing
message. It is read by :func:`agent.legacy.cluster.bounded.load_yaml`: no anchors, aliases or tags,
nested at most :data:`SIZING_MAX_DEPTH` deep (its brackets counted on the raw text, quoted
ones too), at most :data:`SIZING_MAX_NODES` values, all counted before anything is built,
so any value of at most 1024 characters is read within a few ms; its counts are whole
numbers within the message's integer widths, in ASCII digits (YAML 1.1 reads ``7e9`` as a
string: such a string is read as the number it spells). Every refusal is a
:class:`SizingError` whose text says what is wrong, a value it repeats cut
(:func:`agent.legacy.cluster.bounded.shown`).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from agent.admission.sizing import Mode, SizingSpec, size
from agent.core.errors import ValidationError
from agent.legacy.cluster.bounded import Unreadable, load_yaml, shown

SIZING_MAX_DEPTH = 2  # an object of scalars, and room to say a value is not one
SIZING_MAX_NODES = 64  # eight fields, keys and values: 17
MAX_NUMBER = 64  # characters of a number written as a string
SPACES = " \t"  # around a value; any other character is the value's
# a decimal number in ASCII digits (re.ASCII: \d is [0-9]), as Kubernetes writes them
ASCII_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?", re.ASCII)


class SizingError(ValueError):
    """The sizing is not read: ``str()`` says why."""


_UINT32 = ("layers", "kv_heads", "head_dim", "context_length", "concurrent_sequences")
# field -> its largest value (the widths of the Sizing message's integers)
_SIZING_COUNTS = {"parameters": 2**64 - 1, **dict.fromkeys(_UINT32, 2**32 - 1)}
_SIZING_FIELDS = frozenset({*_SIZING_COUNTS, "mode", "dtype"})
_MODES = tuple(m.value for m in Mode)
SIZING_EXAMPLE = "{parameters: 7e9, mode: inference, layers: 32, ...}"


def parse_sizing(text: str) -> SizingSpec:
    """The object of ``text`` as a :class:`SizingSpec`; :class:`SizingError` saying why
    not (bounded: see the module's text)."""
    try:
        data = load_yaml(text, max_depth=SIZING_MAX_DEPTH, max_nodes=SIZING_MAX_NODES)
    except Unreadable as exc:
        raise SizingError(str(exc)) from None
    if not isinstance(data, dict):
        raise SizingError(f"must be an object like {SIZING_EXAMPLE}")
    unknown = sorted(str(k) for k in data if k not in _SIZING_FIELDS)
    if unknown:
        known = ", ".join(sorted(_SIZING_FIELDS))
        raise SizingError(f"unknown field {shown(unknown[0])} ({known})")
    for name in ("parameters", "mode"):
        if data.get(name) is None:
            raise SizingError(f"{name} is required ({SIZING_EXAMPLE})")
    if data["mode"] not in _MODES:
        raise SizingError(f"mode must be {' or '.join(_MODES)}")
    dtype = data.get("dtype", "bf16")
    if not isinstance(dtype, str):
        raise SizingError(f"dtype must be a string (got {shown(dtype)})")
    n = {name: _count(data.get(name, 0), name, high) for name, high in _SIZING_COUNTS.items()}
    return SizingSpec(
        n["parameters"], Mode(data["mode"]), dtype, n["layers"], n["kv_heads"],
        n["head_dim"], n["context_length"], n["concurrent_sequences"] or 1,  # 0: 1, as the agent
    )  # fmt: skip


def _count(value: object, name: str, high: int) -> int:
    """A whole number in [0, high]: an integer, an integral float, or a number in ASCII
    digits as a string (YAML 1.1 reads ``7e9`` as a string)."""
    number: Decimal | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = Decimal(value) if abs(value) <= high else None
    elif isinstance(value, float) and math.isfinite(value):
        number = Decimal(value)
    elif isinstance(value, str) and len(value) <= MAX_NUMBER:
        text = value.strip(SPACES)
        number = Decimal(text) if ASCII_NUMBER.fullmatch(text) else None
    if (
        number is None
        or not number.is_finite()
        or number != number.to_integral_value()
        or not 0 <= number <= high
    ):
        reason = f"{name} must be a whole number from 0 to {high} (got {shown(value)})"
        raise SizingError(reason)
    return int(number)


def sized_bytes(spec: SizingSpec) -> int:
    """The memory a sizing comes to; :class:`SizingError` naming the field it cannot use."""
    try:
        return size(spec).total_bytes
    except ValidationError as exc:
        reason = str(exc).split(": ", 1)[-1]
        raise SizingError(f"{exc.field} {reason}") from None
