"""The server's ``Status`` error bodies: :class:`ApiError` (raised by a handler, answered as
the status and body the real server sends) and the messages it words the same way."""

from __future__ import annotations

from aiohttp import web

from tests.kubeworld.apiserver.objects import Obj

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int, reason: str, message: str, details: Obj | None = None, meta: Obj | None = None
) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": dict(meta or {}),
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    def __init__(
        self,
        code: int,
        message: str,
        reason: str = "",
        details: Obj | None = None,
        meta: Obj | None = None,
    ):
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details
        self.meta = meta  # the Status's ListMeta (an expired continue's new token)

    def body(self) -> Obj:
        return status_body(self.code, self.reason, self.message, self.details, self.meta)

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.code)


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    details = {"name": name, **({"group": group} if group else {}), "kind": resource}
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(404, f'{qualified} "{name}" not found', details=details)


def conflict(resource: str, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {resource} "{name}": {why}'
    return ApiError(409, message, details={"name": name, "kind": resource})


MODIFIED_WHY = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


# -- selectors -----------------------------------------------------------------------------


NAMESPACE_MISMATCH = (
    "the namespace of the provided object does not match the namespace sent on the request"
)
