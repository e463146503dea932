"""The two forms of outside text: ``escaped`` for a field of a log line (as sent when
clean), ``quoted`` inside a sentence (its ends shown); both escape what does not print and
cut what is long."""

from __future__ import annotations

import pytest

from agent.core.logsafe import MAX_LOGGED, escaped, quoted


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("team-a/app", "team-a/app"),
        ("", ""),
        ("a\nb", "a\\nb"),
        ("nul\x00", "nul\\x00"),
        ("rlo\u202e", "rlo\\u202e"),
        ("line\u2028sep", "line\\u2028sep"),
        ("it's \\ raw", "it's \\ raw"),  # printable: kept as it is
        ("x" * MAX_LOGGED, "x" * MAX_LOGGED),
        ("y" * (MAX_LOGGED + 1), "y" * MAX_LOGGED + "…"),
        ("\n" * (MAX_LOGGED + 5), "\\n" * MAX_LOGGED + "…"),
    ],
)
def test_escaped_keeps_a_clean_value_and_escapes_the_rest(value: str, expected: str) -> None:
    assert escaped(value) == expected


@pytest.mark.parametrize(
    ("value", "limit", "expected"),
    [
        ("short", 64, "'short'"),
        ("", 64, "''"),
        ("a\nb", 64, "'a\\nb'"),
        ("it's", 64, '"it\'s"'),
        ("back\\slash", 64, "'back\\\\slash'"),
        ("z" * 3_000_000, 4, "'zzzz…'"),
    ],
)
def test_quoted_shows_the_ends_and_escapes_quotes_too(
    value: str, limit: int, expected: str
) -> None:
    assert quoted(value, limit) == expected


@pytest.mark.parametrize("value", ["a\x1b[2J", "\u202e\u2066x", "tab\there", "\x85"])
def test_both_forms_escape_the_same_characters(value: str) -> None:
    assert quoted(value, 64) == repr(value)
    assert escaped(value) == repr(value)[1:-1]
