"""Lists in pages (``limit`` and ``continue``): the real server's continue token and the
storage key order its pages follow."""

from __future__ import annotations

import base64
import binascii
import json
import posixpath

from tests.kubeworld.apiserver.errors import ApiError
from tests.kubeworld.apiserver.objects import Key

CONTINUE_VERSION = "meta.k8s.io/v1"
_INVALID_CONTINUE = "invalid continue token: continue key is not valid"
EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You "
    "can start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)


def list_key(key: Key, namespace: str) -> str:
    """An object's storage key below the list's prefix (etcd's order is this string's): its
    name in one namespace or cluster-scoped, ``namespace/name`` across namespaces."""
    ns, name = key
    return name if namespace or not ns else f"{ns}/{name}"


def encode_continue(start: str, revision: int) -> str:
    """The real server's continue token: unpadded URL-safe base64 of ``{"v", "rv",
    "start"}``, the key to go on from and the revision every page reads (-1: the latest)."""
    token = json.dumps(
        {"v": CONTINUE_VERSION, "rv": revision, "start": start}, separators=(",", ":")
    )
    return base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode()


def decode_continue(token: str) -> tuple[str, int]:
    """(start key, revision) of a continue token; a 400 for one the server did not make."""
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error) as exc:
        raise ApiError(400, f"{_INVALID_CONTINUE}: {exc}") from None
    if not isinstance(decoded, dict) or decoded.get("v") != CONTINUE_VERSION:
        raise ApiError(400, f"{_INVALID_CONTINUE}: server does not recognize this encoded version")
    revision, start = decoded.get("rv"), decoded.get("start")
    if not isinstance(revision, int) or revision == 0:
        raise ApiError(400, f"{_INVALID_CONTINUE}: incorrect encoded start resourceVersion")
    if not isinstance(start, str) or not start:
        raise ApiError(400, f"{_INVALID_CONTINUE}: encoded start key empty")
    key = start if start.startswith("/") else f"/{start}"
    if posixpath.normpath(key) != key:  # no climbing out of the list's prefix
        raise ApiError(400, f"{_INVALID_CONTINUE}: {start}")
    return key[1:], revision
