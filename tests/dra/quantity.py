"""Kubernetes resource quantities, exactly: ``1.5Gi``, ``256Mi``, ``25``, ``500m``, ``2k``,
``1e3``, held as a whole number of thousandths (the finest precision the API server keeps;
finer fractions round up, as it rounds them) and printed the way the API server
canonicalizes them: a quantity written with a binary suffix prints in BinarySI (``2Gi``,
``1536Mi``; under 1024 or fractional it falls back to DecimalSI, as Go's does), one written
with a decimal suffix or none in DecimalSI (``1k`` for ``1000``, ``1500``, ``500m``), one
written with an exponent in DecimalExponent (``1e3``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction

BINARY, DECIMAL, EXPONENT = "BinarySI", "DecimalSI", "DecimalExponent"
MILLI_PER_UNIT = 1000

_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = {-3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_SUFFIX_SCALE: dict[str, tuple[Fraction, str]] = {
    **{s: (Fraction(1024**i), BINARY) for i, s in enumerate(_BINARY_SUFFIXES) if s},
    **{s: (Fraction(10) ** e, DECIMAL) for e, s in _DECIMAL_SUFFIXES.items()},
}
_QUANTITY = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(?:([eE][+-]?\d+)|([a-zA-Z]*))$")


class QuantityError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class Quantity:
    """An exact quantity: ``milli`` thousandths; ``form`` is how it prints (compared by
    value only)."""

    milli: int
    form: str = field(default=DECIMAL, compare=False)

    @classmethod
    def parse(cls, text: str | int) -> Quantity:
        if isinstance(text, int):
            return cls(text * MILLI_PER_UNIT)
        match = _QUANTITY.match(text.strip())
        if match is None:
            raise QuantityError(f"quantities must match the regular expression: {text!r}")
        sign, number, exponent, suffix = match.groups()
        if exponent:
            scale, form = Fraction(10) ** int(exponent[1:]), EXPONENT
        elif suffix in _SUFFIX_SCALE:
            scale, form = _SUFFIX_SCALE[suffix]
        else:
            raise QuantityError(f"unknown quantity suffix {suffix!r} in {text!r}")
        value = Fraction(number) * scale * (-1 if sign == "-" else 1)
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
    return f"{mantissa}{_DECIMAL_SUFFIXES[power]}"


def q(text: str | int) -> Quantity:
    """Short for :meth:`Quantity.parse`."""
    return Quantity.parse(text)
