"""Kubernetes quantities (``20Gi``, ``1.5Gi``, ``25``, ``500m``, ``1e9``), exactly: a
:class:`~decimal.Decimal`, never a float, so that a capacity summed from shares is the sum
the scheduler made. :func:`binary_quantity` writes a byte count the way the API server
writes it back (the largest binary suffix that divides it)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from agent.core.errors import UnitError

MAX_CHARS = 64
_QUANTITY_RE = re.compile(
    r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>[eE][+-]?\d{1,3}|[KMGTPE]i|[kMGTPEm])?",
    re.ASCII,
)
SCALE = {
    "": Decimal(1), "m": Decimal("0.001"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
    "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
}  # fmt: skip
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def quantity(text: str) -> Decimal:
    """The exact value of a quantity; :class:`UnitError` for anything else."""
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        raise UnitError(f"{str(text)[:MAX_CHARS]!r} is not a quantity")
    match = _QUANTITY_RE.fullmatch(text.strip())
    if match is None:
        raise UnitError(f"{text!r} is not a quantity (examples: 20Gi, 512Mi, 25, 500m)")
    number, suffix = match.group("num"), match.group("suffix") or ""
    try:
        if suffix in SCALE:
            return Decimal(number) * SCALE[suffix]
        return Decimal(number).scaleb(int(suffix[1:]))
    except InvalidOperation as exc:
        raise UnitError(f"{text!r} is not a quantity") from exc


def quantity_bytes(text: str) -> int:
    """A quantity of bytes, rounded up to a whole byte (as the API server rounds)."""
    value = quantity(text)
    if value < 0:
        raise UnitError(f"{text!r} is negative")
    whole = int(value)
    return whole if whole == value else whole + 1


def binary_quantity(value: int) -> str:
    """``85899345920`` -> ``80Gi``; a count no binary suffix divides stays plain digits."""
    for suffix, unit in _BINARY:
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
