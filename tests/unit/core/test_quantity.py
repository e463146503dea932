"""Kubernetes quantities, exactly."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agent.core.errors import UnitError
from agent.core.quantity import binary_quantity, quantity, quantity_bytes


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("20Gi", Decimal(20 * 2**30)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("25", Decimal(25)),
        ("500m", Decimal("0.5")),
        ("1e9", Decimal(10**9)),
        ("2k", Decimal(2000)),
        (" 3Mi ", Decimal(3 * 2**20)),
    ],
)
def test_quantities(text: str, value: Decimal) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["", "20 Gi", "20GiB", "Gi", "1.2.3", "٣Gi", "x" * 100])
def test_what_is_not_a_quantity(text: str) -> None:
    with pytest.raises(UnitError):
        quantity(text)


def test_bytes_round_up_and_refuse_negatives() -> None:
    assert quantity_bytes("1500m") == 2
    assert quantity_bytes("1Ki") == 1024
    with pytest.raises(UnitError, match="negative"):
        quantity_bytes("-1Mi")


@pytest.mark.parametrize(
    ("value", "text"),
    [(80 * 2**30, "80Gi"), (2**20 * 1536, "1536Mi"), (1024, "1Ki"), (1000, "1000"), (0, "0")],
)
def test_binary_quantities_read_back(value: int, text: str) -> None:
    assert binary_quantity(value) == text
    assert quantity_bytes(text) == value
