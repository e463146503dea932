"""The stored objects' vocabulary: a JSON object, its key, the kinds of resource the
stand-in serves (:class:`Kind`), a deep copy of a JSON value, the server's timestamps."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for nodes
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def timestamp(offset_s: float = 0.0) -> str:
    moment = datetime.now(UTC) + timedelta(seconds=offset_s)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Kind:
    resource: str
    kind: str
    api_version: str
    namespaced: bool
    fields: frozenset[str]  # the field selectors it takes
    refusal: str = 'field label not supported: "{path}"'  # of any other field selector
    checked: bool = False  # decoded and validated as the real server does (resource.k8s.io)

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def qualified(self) -> str:
        """``resourceclaims.resource.k8s.io``: how the server's messages name it."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value (what the store holds), without deepcopy's memo."""
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [copy_json(v) for v in value]
    return value


# the field selectors of a kind its server indexes by metadata only, and the refusal of others
META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
META_REFUSAL = '"{path}" is not a known field selector: only "metadata.name", "metadata.namespace"'
