"""The callers' bearer tokens: read from a file handled like a secret, and reloadable.

The file holds one token (its caller is named ``scheduler``), or one ``NAME TOKEN`` pair
per line (``#`` starts a comment): each name is a caller identity that owns the leases it
makes (see :mod:`agent.api.identity`); a name given twice has two tokens (rotation).

A token file must belong to the agent's effective user and be closed to group and others
(0600 or 0400); a known placeholder, or a token with fewer than 128 bits of entropy, is
refused. The estimate is the length times log2 of the smallest alphabet that holds every
character: hex (16), base64 or base64url (64), else printable ASCII (95). The token is
never logged; errors name the file, never its content.
"""

from __future__ import annotations

import hmac
import math
import os
import re
import stat
import string
import threading
from pathlib import Path

from agent.core.errors import ConfigError

KEY = "api.token_file"
MIN_ENTROPY_BITS = 128
MAX_TOKEN_BYTES = 4096
PLACEHOLDERS = frozenset(
    {
        "replace-with-a-long-random-token",
        "changeme",
        "change-me",
        "change_me",
        "replace-me",
        "replaceme",
        "replace_me",
        "secret",
        "password",
        "token",
        "example",
        "placeholder",
        "todo",
        "xxx",
    }
)
_HEX = frozenset(string.hexdigits)
_BASE64 = frozenset(string.ascii_letters + string.digits + "+/=")
_BASE64URL = frozenset(string.ascii_letters + string.digits + "-_=")


def entropy_bits(token: str) -> float:
    """Length x log2(alphabet): hex, base64/base64url, or the 95 printable ASCII."""
    chars = set(token)
    if chars <= _HEX:
        alphabet = 16
    elif chars <= _BASE64 or chars <= _BASE64URL:
        alphabet = 64
    else:
        alphabet = 95
    return len(token) * math.log2(alphabet)


def check_file(path: str) -> None:
    """Refuse a token file that is not a regular file of ours closed to group and others."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ConfigError(KEY, f"cannot read {path}: {exc.strerror}") from exc
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(KEY, f"{path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise ConfigError(
            KEY,
            f"{path} is owned by uid {info.st_uid}, not by the agent's user (uid "
            f"{os.geteuid()}): chown it",
        )
    if mode & 0o077:
        raise ConfigError(
            KEY,
            f"{path} has mode {mode:04o}: group and others must have no access "
            "(chmod 0600 or 0400)",
        )


def check_token(token: str, path: str) -> None:
    """Refuse an empty token, a known placeholder, or one under 128 bits of entropy."""
    if not token:
        raise ConfigError(KEY, f"{path} is empty")
    if token.lower() in PLACEHOLDERS or token.lower().startswith(("replace", "changeme")):
        raise ConfigError(KEY, f"{path} holds a known placeholder, not a token (rule: placeholder)")
    if any(not ch.isprintable() or ch.isspace() for ch in token):
        raise ConfigError(
            KEY, f"{path}: the token holds spaces or control characters (rule: printable)"
        )
    bits = entropy_bits(token)
    if bits < MIN_ENTROPY_BITS:
        raise ConfigError(
            KEY,
            f"{path}: the token has about {bits:.0f} bits of entropy, under "
            f"{MIN_ENTROPY_BITS} (rule: entropy; e.g. head -c 32 /dev/urandom | base64)",
        )


DEFAULT_NAME = "scheduler"
_NAME_RE = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")


def read_tokens(path: str) -> list[tuple[str, str]]:
    """(caller name, token) pairs from ``path``, or a ConfigError naming the file, the line
    and which rule failed. A name may come twice (an old and a new token while rotating)."""
    text = _read_text(path)
    lines = [
        (number, line.split())
        for number, raw in enumerate(text.splitlines(), start=1)
        if (line := raw.split("#", 1)[0].strip())
    ]
    if len(lines) == 1 and len(lines[0][1]) == 1:
        check_token(lines[0][1][0], path)
        return [(DEFAULT_NAME, lines[0][1][0])]
    if not lines:
        raise ConfigError(KEY, f"{path} is empty")
    tokens: list[tuple[str, str]] = []
    for number, words in lines:
        if len(words) != 2 or not _NAME_RE.match(words[0]):
            raise ConfigError(
                KEY, f"{path} line {number}: expected NAME TOKEN (NAME of letters, digits, ._@-)"
            )
        check_token(words[1], f"{path} line {number}")
        tokens.append((words[0], words[1]))
    if len({token for _, token in tokens}) != len(tokens):
        raise ConfigError(KEY, f"{path}: one token comes twice")
    return tokens


def read_token(path: str) -> str:
    """The one token in ``path`` (surrounding whitespace stripped), or a ConfigError
    naming the file and which rule failed."""
    token = _read_text(path).strip()
    check_token(token, path)
    return token


def _read_text(path: str) -> str:
    check_file(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise ConfigError(KEY, f"cannot read {path}: {exc.strerror}") from exc
    if len(raw) > MAX_TOKEN_BYTES:
        raise ConfigError(KEY, f"{path} is larger than {MAX_TOKEN_BYTES} bytes")
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(KEY, f"{path} is not UTF-8 text") from exc


class TokenHolder:
    """The current tokens, swapped whole by :meth:`reload` (a SIGHUP). Calls in flight keep
    the answer they got; new calls see the new tokens."""

    def __init__(self, path: str) -> None:
        self.path = str(Path(path))
        self._expected: tuple[tuple[bytes, str], ...] = ()
        self._lock = threading.Lock()
        self.reload()

    @property
    def expected(self) -> bytes:
        """The first ``Bearer <token>`` as bytes (the only one of a one-token file)."""
        with self._lock:
            return self._expected[0][0]

    def match(self, sent: bytes) -> str | None:
        """The caller name whose ``Bearer <token>`` equals ``sent``, else None; every token
        is compared in constant time, so the time says nothing of which one is close."""
        with self._lock:
            expected = self._expected
        found = None
        for candidate, name in expected:
            if hmac.compare_digest(sent, candidate):
                found = name
        return found

    def reload(self) -> None:
        """Read the file again; a bad file raises ConfigError and keeps the old tokens."""
        tokens = read_tokens(self.path)
        expected = tuple((f"Bearer {token}".encode(), name) for name, token in tokens)
        with self._lock:
            self._expected = expected
