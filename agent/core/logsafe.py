"""Text from outside (names and values from an API, a caller, a kubelet) made fit for one
log line or one message: every character that is not printable (controls, line and
paragraph separators, bidirectional formatting) written as its Python escape, so that no
value can start a line of its own or reorder what people read; and cut, so that no value
can make a line long.

Two forms, for two places, on one rule (``str.isprintable``, which is what ``repr``
escapes):

- :func:`escaped`, unquoted: a value that fills a field of a log line
  (``claim %s (uid %s)``) reads as it was sent when it is clean.
- :func:`quoted`, ``repr``-quoted: a value inside a sentence (a refusal, an error
  answered to a caller) shows where it starts and ends (an empty value, a trailing space),
  and a quote or backslash in it cannot pass for the message's own.
"""

from __future__ import annotations

MAX_LOGGED = 256  # characters of a value kept in a log line


def escaped(value: str, limit: int = MAX_LOGGED) -> str:
    """``value`` with its unprintable characters escaped (``\\n``, ``\\x00``, ``\\u202e``),
    at most ``limit`` characters of it, then an ellipsis."""
    if len(value) <= limit and value.isprintable():
        return value  # the common case, checked in C
    kept = "".join(ch if ch.isprintable() else _escape(ch) for ch in value[:limit])
    return kept if len(value) <= limit else kept + "…"


def quoted(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters (then an ellipsis, inside the quotes) and
    ``repr``-quoted: escaped as :func:`escaped` escapes, and its quotes and backslashes."""
    return repr(value if len(value) <= limit else value[:limit] + "…")


def _escape(ch: str) -> str:
    return repr(ch)[1:-1]  # repr escapes exactly what is not printable
