import pytest

from agent.core.errors import UnitError
from agent.core.units import (
    GIB,
    MIB,
    check_thread_percentage,
    format_bytes,
    mps_memory_limit,
    parse_bytes,
    parse_mps_memory_limit,
)

PARSE_CASES = [
    # (description, text, bytes)
    ("binary GiB", "10GiB", 10 * GIB),
    ("binary MiB", "512MiB", 512 * MIB),
    ("bare G is binary and takes fractions", "1.5G", 3 * GIB // 2),
    ("decimal GB", "80GB", 80 * 1000**3),
    ("bare number is bytes", "1024", 1024),
    ("case and spaces", " 2 gib ", 2 * GIB),
    ("T suffix", "1T", 1024**4),
    ("fraction rounds down to whole bytes", "0.5K", 512),
    ("leading dot", ".5G", GIB // 2),
]


@pytest.mark.parametrize(("description", "text", "expected"), PARSE_CASES)
def test_parse_bytes(description: str, text: str, expected: int) -> None:
    assert parse_bytes(text) == expected, description


@pytest.mark.parametrize("text", ["", "G", "-1G", "1.5.2G", "12 parsecs", "1e3G", "nan"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(UnitError):
        parse_bytes(text)


MPS_RENDER_CASES = [
    ("whole GiB renders as MiB", 2 * GIB, "2048M"),
    ("fractions of a GiB stay exact in MiB", 3 * GIB // 2, "1536M"),
    ("partial MiB rounds down, never up", 512 * MIB + 1000, "512M"),
    ("exactly one MiB", MIB, "1M"),
]


@pytest.mark.parametrize(("description", "value", "expected"), MPS_RENDER_CASES)
def test_mps_memory_limit(description: str, value: int, expected: str) -> None:
    assert mps_memory_limit(value) == expected, description


@pytest.mark.parametrize("value", [0, MIB - 1, -GIB])
def test_mps_memory_limit_rejects_what_mps_cannot_express(value: int) -> None:
    with pytest.raises(UnitError):
        mps_memory_limit(value)


@pytest.mark.parametrize(
    ("text", "expected"), [("2G", 2 * GIB), ("512M", 512 * MIB), ("4G", 4096 * MIB)]
)
def test_parse_mps_memory_limit(text: str, expected: int) -> None:
    assert parse_mps_memory_limit(text) == expected


@pytest.mark.parametrize("text", ["", "2T", "1.5G", "-1G", "G"])
def test_parse_mps_memory_limit_rejects(text: str) -> None:
    with pytest.raises(UnitError):
        parse_mps_memory_limit(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(80 * GIB, "80.0 GiB"), (512 * MIB, "512.0 MiB"), (17, "17 B"), (1536, "1.5 KiB")],
)
def test_format_bytes(value: int, expected: str) -> None:
    assert format_bytes(value) == expected


@pytest.mark.parametrize("value", [0.0, -5.0, 100.1, float("nan"), float("inf")])
def test_thread_percentage_bounds(value: float) -> None:
    with pytest.raises(UnitError):
        check_thread_percentage(value)


def test_thread_percentage_accepts_full_range() -> None:
    assert check_thread_percentage(100.0) == 100.0
    assert check_thread_percentage(0.1) == 0.1
