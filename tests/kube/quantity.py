"""Kubernetes resource quantities (``resource.Quantity``) read exactly, as the API server
reads them: a number with an optional binary (``Ki`` .. ``Ei``), decimal (``n u m k M G T P
E``) or exponent (``e3``, ``E-2``) suffix, held as a :class:`~fractions.Fraction`.

``agent.core.units.parse_bytes`` is not this: it reads people's sizes (``1.5G`` as GiB,
``m`` as MiB) through floats. Here ``1.5G`` is 1 500 000 000 and ``100m`` is 1/10.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

# what the API server's decoder says of a quantity it cannot read
FORMAT_MESSAGE = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_FORM = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?$"
)
_BINARY = {f"{s}i": 1024**n for n, s in enumerate("KMGTPE", start=1)}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(ValueError):
    """Not a quantity the API server would read."""


def parse_quantity(text: Any) -> Fraction:
    """A quantity (a JSON string or number) as an exact fraction; ``None`` is zero, as the
    server decodes a null quantity."""
    if text is None:
        return Fraction(0)
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise QuantityError(FORMAT_MESSAGE)
    match = _FORM.match(str(text))
    if match is None:
        raise QuantityError(FORMAT_MESSAGE)
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:] or 0)
    return number * Fraction(10) ** exponent


def integer_value(quantity: Fraction) -> int:
    """``Quantity.Value()``: the whole number, rounded away from zero."""
    return math.ceil(quantity) if quantity >= 0 else math.floor(quantity)


def render(quantity: Fraction) -> str:
    """A plain decimal spelling of ``quantity`` (for messages)."""
    if quantity.denominator == 1:
        return str(quantity.numerator)
    return f"{float(quantity):g}"
