"""Kubernetes resource quantities (``resource.Quantity``), read exactly as the API server
reads them: a number with an optional binary (``Ki`` .. ``Ei``), decimal (``n u m k M G T P
E``) or exponent (``e3``, ``E-2``) suffix. The one reader of the test world:

- :func:`parse_quantity`: the exact value, a :class:`~fractions.Fraction` (the API stand-in's
  decoding and validation);
- :class:`Quantity`: a value held as a whole number of thousandths (finer fractions round
  up) with the form it prints in, the way the API server canonicalizes a quantity: a
  quantity written with a binary suffix prints in BinarySI (``2Gi``, ``1536Mi``; under 1024
  or fractional it falls back to DecimalSI, as Go's does), one written with a decimal suffix
  or none in DecimalSI (``1k`` for ``1000``, ``1500``, ``500m``), one written with an
  exponent in DecimalExponent (``1e3``) (the DRA allocator's and scheduler's arithmetic).

``agent.core.units.parse_bytes`` is not this: it reads people's sizes (``1.5G`` as GiB,
``m`` as MiB) through floats. Here ``1.5G`` is 1 500 000 000 and ``100m`` is 1/10.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
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
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_BINARY = {s: 1024**n for n, s in enumerate(_BINARY_SUFFIXES) if s}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

BINARY, DECIMAL, EXPONENT = "BinarySI", "DecimalSI", "DecimalExponent"
MILLI_PER_UNIT = 1000
_DECIMAL_PRINTED = {-3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


class QuantityError(ValueError):
    """Not a quantity the API server would read."""


def read_quantity(text: Any) -> tuple[Fraction, str]:
    """(the exact value, the form it is written in: :data:`BINARY`, :data:`DECIMAL` or
    :data:`EXPONENT`) of a quantity (a JSON string or number); ``None`` is zero, as the
    server decodes a null quantity."""
    if text is None:
        return Fraction(0), DECIMAL
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise QuantityError(FORMAT_MESSAGE)
    match = _FORM.match(str(text))
    if match is None:
        raise QuantityError(FORMAT_MESSAGE)
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix], BINARY
    if suffix in _DECIMAL or not suffix:
        return number * Fraction(10) ** _DECIMAL.get(suffix, 0), DECIMAL
    return number * Fraction(10) ** int(suffix[1:]), EXPONENT


def parse_quantity(text: Any) -> Fraction:
    """A quantity (a JSON string or number) as an exact fraction (see :func:`read_quantity`)."""
    return read_quantity(text)[0]


def integer_value(quantity: Fraction) -> int:
    """``Quantity.Value()``: the whole number, rounded away from zero."""
    return math.ceil(quantity) if quantity >= 0 else math.floor(quantity)


def render(quantity: Fraction) -> str:
    """A plain decimal spelling of ``quantity`` (for messages)."""
    if quantity.denominator == 1:
        return str(quantity.numerator)
    return f"{float(quantity):g}"


@dataclass(frozen=True, order=True)
class Quantity:
    """An exact quantity: ``milli`` thousandths; ``form`` is how it prints (compared by
    value only)."""

    milli: int
    form: str = field(default=DECIMAL, compare=False)

    @classmethod
    def parse(cls, text: str | int) -> Quantity:
        """``text`` (surrounding blanks dropped, as the server's JSON decoder drops them),
        rounded up to a thousandth."""
        if isinstance(text, int):
            return cls(text * MILLI_PER_UNIT)
        try:
            value, form = read_quantity(text.strip())
        except QuantityError:
            why = "a number, then a known suffix or an exponent"
            raise QuantityError(f"{text!r} is no quantity ({why}): {FORMAT_MESSAGE}") from None
        return cls(math.ceil(value * MILLI_PER_UNIT), form)

    @classmethod
    def of_units(cls, units: int, form: str = DECIMAL) -> Quantity:
        return cls(units * MILLI_PER_UNIT, form)

    def value(self) -> int:
        """Go's ``Quantity.Value()``: whole units, a fraction rounded up."""
        return -((-self.milli) // MILLI_PER_UNIT)

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.milli + other.milli, self.form)

    def __str__(self) -> str:
        whole = self.milli % MILLI_PER_UNIT == 0
        units = self.milli // MILLI_PER_UNIT
        if self.form == BINARY and whole and abs(units) >= 1024:
            return _binary(units)
        return _decimal(self.milli, exponent=self.form == EXPONENT)


ZERO = Quantity(0)


def _binary(units: int) -> str:
    power = 0
    while units % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
        units //= 1024
        power += 1
    return f"{units}{_BINARY_SUFFIXES[power]}"


def _decimal(milli: int, *, exponent: bool) -> str:
    if milli == 0:
        return "0"
    mantissa, power = milli, -3
    while mantissa % 10 == 0:
        mantissa //= 10
        power += 1
    while power % 3:
        mantissa *= 10
        power -= 1
    while power > 18:
        mantissa *= 1000
        power -= 3
    if exponent:
        return f"{mantissa}e{power}" if power else str(mantissa)
    return f"{mantissa}{_DECIMAL_PRINTED[power]}"


def q(text: str | int) -> Quantity:
    """Short for :meth:`Quantity.parse`."""
    return Quantity.parse(text)
