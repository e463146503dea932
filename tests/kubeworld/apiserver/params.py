"""The request's parameters as the real server reads them: the Kubernetes verb, selectors,
boolean and integer query parameters, JSON bodies and DeleteOptions."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from tests.kubeworld.apiserver.errors import ApiError
from tests.kubeworld.apiserver.objects import Kind, Obj
from tests.kubeworld.apiserver.selection import Selector


def verb(request: web.Request) -> str:
    method = request.method
    named = "name" in request.match_info
    if method == "GET":
        if flag(request.query.get("watch")):
            return "watch"
        return "get" if named else "list"
    if method == "DELETE" and not named:
        return "deletecollection"
    return {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}.get(
        method, method.lower()
    )


def selector_of(kind: Kind, query: Mapping[str, str]) -> Selector:
    fields, labels = query.get("fieldSelector", ""), query.get("labelSelector", "")
    return Selector.parse(fields, labels, kind.fields, kind.refusal)


async def delete_options(request: web.Request) -> Obj:
    body = await read_json(request) if request.can_read_body else {}
    if not isinstance(body, dict):
        raise ApiError(400, "the body is not DeleteOptions")
    return body


def flag(text: str | None) -> bool:
    """A boolean query parameter, as Go's strconv.ParseBool reads it."""
    return text in ("1", "t", "T", "true", "TRUE", "True")


def int_param(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ApiError(400, f"invalid {what}: {text!r}") from None


# -- lists in pages (``limit`` and ``continue``) --------------------------------------------


async def read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"the request body is not JSON: {exc}") from None
