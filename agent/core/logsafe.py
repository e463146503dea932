"""Text from outside (names and values from an API, a caller, a kubelet) made fit for one
log line: every character that is not printable (controls, line and paragraph separators,
bidirectional formatting) written as its Python escape, so that no value can start a line
of its own or reorder what people read; and cut, so that no value can make a line long.
"""

from __future__ import annotations

MAX_LOGGED = 256  # characters of a value kept in a log line


def escaped(value: str, limit: int = MAX_LOGGED) -> str:
    """``value`` with its unprintable characters escaped (``\\n``, ``\\x00``, ``\\u202e``),
    at most ``limit`` characters of it, then an ellipsis."""
    kept = "".join(ch if ch.isprintable() else _escape(ch) for ch in value[:limit])
    return kept if len(value) <= limit else kept + "…"


def _escape(ch: str) -> str:
    return repr(ch)[1:-1]  # repr escapes exactly what is not printable
