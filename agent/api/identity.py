"""Who is calling: the caller identity that owns the leases it makes.

On the Unix socket the caller is ``local``, the on-call engineer: it may act on every lease
and sees every lease id. On TCP the caller is the subject of its client certificate (the
common name) under mutual TLS, else the name of the bearer token it sent (see
:mod:`agent.api.tokens`). A caller may release, commit and abort only what it made; it sees
other callers' lease ids only with the ``observer`` role (``api.observers``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.api.tokens import TokenHolder

CERT_NAME_KEY = "x509_common_name"
LOCAL_NAME = "local"


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    observer: bool = False
    admin: bool = False

    @property
    def owner(self) -> str | None:
        """The owner whose leases this caller may act on; None: every lease (admin)."""
        return None if self.admin else self.name

    def sees(self, owner: str) -> bool:
        """May this caller see the ids of a lease made by ``owner``?"""
        return self.admin or self.observer or (bool(owner) and owner == self.name)


LOCAL = Caller(LOCAL_NAME, observer=True, admin=True)
Identify = Callable[[Any], Caller]  # a gRPC servicer context -> its caller


def local(_context: Any) -> Caller:
    return LOCAL


def observers_of(setting: str) -> frozenset[str]:
    """``api.observers``: comma-separated caller names."""
    return frozenset(name.strip() for name in setting.split(",") if name.strip())


class TcpIdentify:
    """The caller of a TCP call: its certificate's common name, else its token's name."""

    def __init__(self, tokens: TokenHolder | None, observers: frozenset[str]) -> None:
        self._tokens = tokens
        self._observers = observers

    def __call__(self, context: Any) -> Caller:
        name = self._certificate_name(context.auth_context()) or self._token_name(context)
        # The interceptor has let through only authenticated calls; "unknown" stays
        # distinct from every configured name, so it owns nothing of anyone else's.
        name = name or "unknown"
        return Caller(name, observer=name in self._observers)

    @staticmethod
    def _certificate_name(auth: Mapping[str, Any]) -> str:
        values = auth.get(CERT_NAME_KEY) or ()
        return values[0].decode(errors="replace") if values else ""

    def _token_name(self, context: Any) -> str:
        if self._tokens is None:
            return ""
        metadata = dict(context.invocation_metadata() or ())
        return self._tokens.match(str(metadata.get("authorization", "")).encode()) or ""
