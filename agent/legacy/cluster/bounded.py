"""Reading what a caller sends the cluster side, with its cost bounded before it is paid.

:func:`load_json` reads an HTTP body: UTF-8 only, then a scan of its raw bytes counts its
values, measures its nesting and the length of its numbers (at most :data:`MAX_DIGITS`
digits in a row), and only a body within these limits is handed to :func:`json.loads`.
The scan is a few passes of ``bytes`` methods and one regular expression (strings
skipped), no Python object per value: a body 100,000 deep, of a million empty arrays or of
thousands of 4,000-digit integers is refused without being built.

:func:`load_yaml` reads a short YAML (or JSON) text, such as an annotation's value: the
nesting of its flow brackets is measured on the raw text first (PyYAML's scanner pays the
square of a run of brackets before its composer could count one level: 1024 ``[`` cost
about 100 ms), then anchors, aliases and explicit tags (``!!int``, ``!name``) are refused
and the nesting and the number of nodes counted as the document is composed: no value is
expanded or built past the limits, so a few hundred characters of aliases cannot cost
seconds and hundreds of MiB, and no tag's constructor meets a value it was not written
for. A text of 1024 characters costs a few ms at most.

Both raise :class:`Unreadable`, which says what is wrong without repeating the input.
:func:`printable` makes a caller's text safe for one log line, :func:`shown` any
value a caller sent safe to repeat in an answer.
"""

from __future__ import annotations

import json
import re
import reprlib
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent

MAX_LOGGED = 200  # characters of a caller's text in a log line
MAX_SHOWN = 40  # characters of a caller's value repeated in an answer
# Digits in a row in a JSON number. Kubernetes writes int64s and float64s (at most about 25);
# Python turns a decimal integer into an int in time that grows as the square of its digits.
MAX_DIGITS = 100

# A JSON string (escapes included) or, unterminated, the rest of the body: every quote
# starts a match that succeeds, so the scan is linear whatever the bytes.
_STRING_RE = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_PARENS = bytes.maketrans(_BRACKETS, b"()()")  # the shape of the nesting, kind aside
_NOT_FLOW_BRACKETS_RE = re.compile(r"[^\[\]{}]+")
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_NUMBER = b"0" * (MAX_DIGITS + 1)


class Unreadable(ValueError):
    """The input is not read: ``str()`` says why, never repeating the input."""


def load_json(raw: bytes, *, max_depth: int, max_values: int) -> Any:
    """The JSON document of ``raw``: UTF-8, nested at most ``max_depth`` deep, at most
    ``max_values`` values (each array or object counts one, and each member of one)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unreadable(f"not UTF-8 (byte {exc.start})") from None
    if raw.count(b'"') > 2 * max_values:  # two per string: bounds the strings skipped below
        raise Unreadable(f"has more than {max_values} values")
    skeleton = _STRING_RE.sub(b"", raw)  # what is left: brackets, numbers, words, commas
    opened = skeleton.count(b"[") + skeleton.count(b"{")
    if opened + skeleton.count(b",") + 1 > max_values:
        raise Unreadable(f"has more than {max_values} values")
    if _LONG_NUMBER in skeleton.translate(_DIGITS_AS_ZERO):
        raise Unreadable(f"has a number of more than {MAX_DIGITS} digits")
    if _deeper(skeleton.translate(_PARENS, _NOT_BRACKETS), max_depth):
        raise Unreadable(f"nested deeper than {max_depth}")
    try:
        return json.loads(raw)
    except RecursionError:  # not reached within max_depth; kept as the last word
        raise Unreadable(f"nested deeper than {max_depth}") from None
    except ValueError as exc:  # JSONDecodeError, and integers past Python's digit limit
        raise Unreadable(f"not JSON: {printable(str(exc), 120)}") from None


def _deeper(shape: bytes, depth: int) -> bool:
    """Whether brackets (``shape``: only ``(`` and ``)``) nest deeper than ``depth``. Each
    pass takes away every innermost pair, one level; what ``depth`` passes leave, if it
    still pairs, is deeper. What never pairs (``)(``, an unclosed run) is left for the
    parser to report, unless it opens more than ``depth`` in a row."""
    too_deep = b"(" * (depth + 1)
    if too_deep in shape:
        return True
    for _ in range(depth):
        shorter = shape.replace(b"()", b"")
        if len(shorter) == len(shape):
            return False  # empty, or brackets that never pair: not JSON
        shape = shorter
    return b"()" in shape


def _flow_deeper(text: str, depth: int) -> bool:
    """Whether the flow brackets of ``text`` (``[ ] { }``) nest deeper than ``depth``,
    counted on the raw text before PyYAML sees it: its scanner keeps a possible key for
    each open bracket and walks all of them at every token, so a deep run costs the square
    of its length before the composer could count a level. Every bracket counts, quoted or
    in a comment too (a conservative refusal: no value within ``depth`` holds more), and a
    close with nothing open lowers nothing: the scanner counts it below zero, and the opens
    after it pile up their keys all the same (``]`` then ``[[[`` is three deep)."""
    level = 0
    for bracket in _NOT_FLOW_BRACKETS_RE.sub("", text):
        level = level + 1 if bracket in "[{" else max(level - 1, 0)
        if level > depth:
            return True
    return False


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader whose composer refuses anchors, aliases and tags and counts
    the nesting and the nodes of the document before each node is composed."""

    def __init__(self, text: str, *, max_depth: int, max_nodes: int) -> None:
        super().__init__(text)
        self._max_depth, self._max_nodes = max_depth, max_nodes
        self._depth = self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent) or (
            isinstance(event, NodeEvent) and event.anchor is not None
        ):
            raise Unreadable("has anchors or aliases (&name, *name), which are not accepted")
        if isinstance(event, NodeEvent) and getattr(event, "tag", None) is not None:
            raise Unreadable("has a tag (!!int, !name), which is not accepted")
        self._nodes += 1
        if self._nodes > self._max_nodes:
            raise Unreadable(f"has more than {self._max_nodes} values")
        nested = isinstance(event, CollectionStartEvent)
        if self._depth + nested > self._max_depth:
            raise Unreadable(f"is nested deeper than {self._max_depth}")
        self._depth += nested
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= nested


def load_yaml(text: str, *, max_depth: int, max_nodes: int) -> Any:
    """The one YAML (or JSON) document of ``text``: no anchors, aliases or tags,
    collections nested at most ``max_depth`` deep, at most ``max_nodes`` nodes; plain
    values are read as YAML 1.1 reads them (``7e9`` a string, ``1.5`` a float)."""
    if _flow_deeper(text, max_depth):
        raise Unreadable(f"is nested deeper than {max_depth}")
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text, max_depth=max_depth, max_nodes=max_nodes)
        return loader.get_single_data()
    except Unreadable:
        raise
    except yaml.YAMLError as exc:  # the reader's, the scanner's, the parser's, ...
        said = [getattr(exc, name, None) for name in ("context", "problem", "reason")]
        problem = " ".join(str(part) for part in said if part) or "unreadable"
        raise Unreadable(f"is not YAML or JSON: {printable(problem, 80)}") from None
    except (ValueError, TypeError, LookupError, OverflowError, RecursionError) as exc:
        # what a plain value's constructor can raise: 2024-13-45 (a date), 0x_ (an integer)
        raise Unreadable(f"is not YAML or JSON: {printable(str(exc), 80)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def printable(text: str, limit: int = MAX_LOGGED) -> str:
    """``text`` for a log line, cut at ``limit``: every character that does not print
    (newlines, terminal escapes, bidirectional overrides, odd spaces) written as its
    escape, ``\\n``, ``\\x1b``, ``\\u202e``."""
    cut = _cut(text, limit)
    if cut.isprintable():
        return cut
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in cut)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _short_repr() -> reprlib.Repr:
    short = reprlib.Repr()
    short.maxlevel, short.maxdict, short.maxlist = 2, 3, 3
    short.maxstring = short.maxlong = short.maxother = MAX_SHOWN
    return short


_SHORT = _short_repr()


def shown(value: object) -> str:
    """A caller's value for a message: cut short and repr-quoted (nothing printed raw).
    Never more work than its first few parts: a list of a million items, or one that holds
    itself nine times at every level, is not printed first and cut after; a huge integer is
    described by its size, never turned into text."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, int) and abs(value) >= 10**MAX_SHOWN:
        digits = int(abs(value).bit_length() * 0.30103) + 1
        text = f"{'-' if value < 0 else ''}a number of about {digits} digits"
    else:
        text = _SHORT.repr(value)
    return repr(text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…")
