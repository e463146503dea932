"""Sizes and percentages: parsing what people write, rendering what MPS accepts.

Binary and decimal spellings are both accepted for sizes; a bare ``G``/``M``/``K``/``T``
suffix is read as binary (GiB, MiB, ...) because that is what ``nvidia-smi`` and the MPS
front-end mean by it. MPS pinned-memory limits are always rendered as a whole number of
MiB followed by ``M``: the 535 front-end silently misreads fractions (``1.5G`` -> 1 MiB),
``T`` and ``K`` suffixes (read as MiB) and negative values (wrapped around).
"""

from __future__ import annotations

import math
import re

from agent.core.errors import UnitError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

_SIZE_RE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$")

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": KIB,
    "kib": KIB,
    "kb": 1000,
    "m": MIB,
    "mib": MIB,
    "mb": 1000**2,
    "g": GIB,
    "gib": GIB,
    "gb": 1000**3,
    "t": TIB,
    "tib": TIB,
    "tb": 1000**4,
}


def parse_bytes(text: str) -> int:
    """Parse ``10GiB``, ``512MiB``, ``1.5G``, ``80GB`` or ``1024`` into a whole number of bytes.

    Fractions are allowed and rounded down to a whole byte. Negative numbers and unknown
    suffixes raise :class:`UnitError`.
    """
    match = _SIZE_RE.match(text)
    if match is None:
        raise UnitError(f"cannot read {text!r} as a size (examples: 10GiB, 512MiB, 1.5G)")
    unit = match.group("unit").lower()
    if unit not in _SIZE_UNITS:
        raise UnitError(f"unknown size unit {match.group('unit')!r} in {text!r}")
    value = float(match.group("num")) * _SIZE_UNITS[unit]
    if not math.isfinite(value):
        raise UnitError(f"size {text!r} is not finite")
    return int(value)


def format_bytes(value_bytes: int) -> str:
    """Render a byte count for people: ``80.0 GiB``, ``512.0 MiB``, ``17 B``."""
    if value_bytes < 0:
        raise UnitError(f"negative size {value_bytes}")
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if value_bytes >= size:
            return f"{value_bytes / size:.1f} {unit}"
    return f"{value_bytes} B"


def mps_memory_limit(value_bytes: int) -> str:
    """Render a pinned-memory limit the way MPS reads it correctly: whole MiB and ``M``.

    The value is rounded down to a whole MiB, so the limit never grows. Anything under
    1 MiB cannot be expressed (``0`` would clear the limit) and raises :class:`UnitError`.
    """
    mib = value_bytes // MIB
    if mib < 1:
        raise UnitError(f"memory limit {value_bytes} bytes is under 1 MiB; MPS cannot express it")
    return f"{mib}M"


_MPS_LIMIT_RE = re.compile(r"^(?P<num>\d+)(?P<unit>[MG])$")


def parse_mps_memory_limit(text: str) -> int:
    """Parse a limit as the MPS front-end prints it (``2G``, ``512M``) into bytes."""
    match = _MPS_LIMIT_RE.match(text.strip())
    if match is None:
        raise UnitError(f"not an MPS memory limit: {text!r}")
    scale = GIB if match.group("unit") == "G" else MIB
    return int(match.group("num")) * scale


def check_thread_percentage(value: float) -> float:
    """Validate an active-thread percentage: MPS accepts (0, 100]."""
    if not math.isfinite(value) or value <= 0.0 or value > 100.0:
        raise UnitError(f"thread percentage {value} is outside (0, 100]")
    return value
