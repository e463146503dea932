"""The admission webhook for pods (``admission.k8s.io/v1`` AdmissionReview).

``POST /mutate`` (a MutatingWebhookConfiguration, CREATE) and ``POST /validate`` (a
ValidatingWebhookConfiguration, CREATE and UPDATE of ``pods`` and
``pods/ephemeralcontainers``) judge a pod that wants a GPU share
(:func:`agent.legacy.cluster.annotations.wants_share`) by the rules of
:mod:`agent.legacy.cluster.podrules` and refuse it with the field and the reason, which
``kubectl apply`` prints as it is.
``require_user`` (``kube serve --run-as-user``, required by default) asks a new share pod
to state its share's one UID (``securityContext.runAsUser``).

On CREATE, ``/mutate`` answers a JSONPatch that sets ``spec.schedulerName: gpushare``
(when unset or ``default-scheduler``) and adds the finalizer ``gpushare.io/lease`` (once).
On UPDATE only the change is judged; the ``ephemeralcontainers`` subresource (``kubectl
debug``) is an UPDATE too, and its added containers are judged. Other subresources
(``status``, ...) and DELETE are allowed.

A review is a pod's when its ``request.kind`` is ``Pod``, its ``request.resource`` is
``pods`` or its object says ``kind: Pod``: the API server always sends ``kind``, and a
review without one is not read. A body that is not an AdmissionReview is answered HTTP 400
and one log line: over 4 MiB (413), not UTF-8 JSON, nested deeper than 64, of more than
100,000 values or with a number of more than 100 digits
(:func:`agent.legacy.cluster.bounded.load_json`, before it is built), not an object,
or with a request that lacks what the API server always sends. Values that reach the log
are escaped (:func:`agent.legacy.cluster.bounded.printable`) and those in a refusal cut
(:func:`agent.legacy.cluster.annotations.shown`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agent.core.errors import ConfigError
from agent.legacy.cluster.annotations import FINALIZER, SCHEDULER_NAME, mapping, wants_share
from agent.legacy.cluster.bounded import Unreadable, load_json, printable, shown
from agent.legacy.cluster.podrules import (
    Refusal,
    check_ephemeral,
    check_new_pod,
    check_update,
    text_of,
)

log = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
# a pod and its old copy (each at most 1.5 MiB, etcd's largest object) fit within; the
# costliest review within these limits takes under 100 ms of CPU and 50 MiB to read
MAX_REVIEW_BYTES = 4 * 2**20
MAX_REVIEW_DEPTH = 64  # a pod's deepest field (affinity terms, managedFields) is about 15
MAX_REVIEW_VALUES = 100_000
MAX_UID = 128  # the API server's are UUIDs (36 characters)
_REASONS = {400: "BadRequest", 403: "Forbidden"}


class MalformedReview(Exception):
    """The body is not an ``admission.k8s.io/v1`` AdmissionReview with a request."""


@dataclass(frozen=True, slots=True)
class Review:
    uid: str
    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    namespace: str
    kind: str  # request.kind.kind: "Pod" for ours
    resource: str  # request.resource.resource: "pods" for ours
    sub_resource: str
    pod: Mapping[str, Any]  # request.object, namespace filled in
    old: Mapping[str, Any]  # request.oldObject ({} unless UPDATE)

    @property
    def of_pod(self) -> bool:
        """Whether any part of the review says it is a pod's (see the module's text)."""
        objects = (self.pod.get("kind"), self.old.get("kind"))
        return self.kind == "Pod" or self.resource == "pods" or "Pod" in objects


def read_review(body: object) -> Review:
    """The review's request, or :class:`MalformedReview` saying what is wrong with it."""
    if not isinstance(body, dict):
        raise MalformedReview("the body must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        raise MalformedReview(f"expected apiVersion {API_VERSION} and kind AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("request is missing or not an object")
    uid, operation = request.get("uid"), request.get("operation")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("request.uid is missing")
    if len(uid) > MAX_UID:
        raise MalformedReview(f"request.uid is longer than {MAX_UID} characters")
    if operation not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise MalformedReview(f"request.operation {shown(operation)} is not one Kubernetes sends")
    namespace = request.get("namespace") or ""
    pod, old = request.get("object"), request.get("oldObject")
    if operation in ("CREATE", "UPDATE") and not isinstance(pod, dict):
        raise MalformedReview(f"request.object must be an object for {operation}")
    if operation == "UPDATE" and not isinstance(old, dict):
        raise MalformedReview("request.oldObject must be an object for UPDATE")
    return Review(
        uid=uid,
        operation=operation,
        namespace=namespace if isinstance(namespace, str) else "",
        kind=_kind(request),
        resource=text_of(mapping(request.get("resource")).get("resource")),
        sub_resource=_sub_resource(request),
        pod=_in_namespace(mapping(pod), namespace),
        old=_in_namespace(mapping(old), namespace),
    )


def _kind(request: Mapping[str, Any]) -> str:
    """request.kind.kind, which the API server always sends: a review without it is not
    judged, whatever its object."""
    kind = request.get("kind")
    if not isinstance(kind, Mapping) or "kind" not in kind:
        raise MalformedReview("request.kind is missing (the API server always sends it)")
    return text_of(kind["kind"])


def _sub_resource(request: Mapping[str, Any]) -> str:
    value = request.get("subResource")
    if value is not None and not isinstance(value, str):
        raise MalformedReview("request.subResource must be a string")
    return value or ""


def _in_namespace(pod: Mapping[str, Any], namespace: object) -> Mapping[str, Any]:
    """A new pod's object may leave metadata.namespace to the request's."""
    meta = mapping(pod.get("metadata"))
    if not pod or meta.get("namespace") or not isinstance(namespace, str):
        return pod
    return {**pod, "metadata": {**meta, "namespace": namespace}}


# -- the checks --------------------------------------------------------------------------


def check(review: Review, *, require_user: bool = True) -> None:
    """Raise :class:`Refusal` for a pod this review may not create or change."""
    if not review.of_pod:
        return
    if review.sub_resource == "ephemeralcontainers" and review.operation == "UPDATE":
        check_ephemeral(review.old, review.pod)
    elif review.sub_resource:
        return
    elif review.operation == "CREATE":
        check_new_pod(review.pod, require_user=require_user)
    elif review.operation == "UPDATE":
        check_update(review.old, review.pod)


# -- the answers -------------------------------------------------------------------------


def mutation(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch for a pod that wants a share: the scheduler and the finalizer."""
    operations: list[dict[str, Any]] = []
    if not wants_share(pod):
        return operations
    meta, spec = mapping(pod.get("metadata")), mapping(pod.get("spec"))
    if spec.get("schedulerName") != SCHEDULER_NAME:
        operations.append({"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME})
    finalizers = meta.get("finalizers")
    if not isinstance(finalizers, list):
        operations.append({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]})
    elif FINALIZER not in finalizers:
        operations.append({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER})
    return operations


def answer(review: Review, *, mutate: bool, require_user: bool = True) -> dict[str, Any]:
    """The AdmissionReview to send back."""
    response: dict[str, Any] = {"uid": review.uid, "allowed": True}
    try:
        check(review, require_user=require_user)
    except Refusal as refusal:
        log.info(
            "refused %s of pod %s: %s",
            review.operation,
            printable(_name(review)),
            printable(refusal.message),
        )
        status = {
            "code": refusal.code,
            "reason": _REASONS[refusal.code],
            "message": refusal.message,
        }
        response.update(allowed=False, status=status)
    else:
        patch = mutation(review.pod) if mutate and review.operation == "CREATE" else []
        if patch and review.of_pod and not review.sub_resource:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def _name(review: Review) -> str:
    meta = mapping(review.pod.get("metadata") or review.old.get("metadata"))
    name = text_of(meta.get("name")) or text_of(meta.get("generateName")) or "?"
    return f"{review.namespace or text_of(meta.get('namespace'))}/{name}"


async def _review(request: web.Request, *, mutate: bool, require_user: bool) -> web.Response:
    try:
        body = load_json(
            await request.read(), max_depth=MAX_REVIEW_DEPTH, max_values=MAX_REVIEW_VALUES
        )
        review = read_review(body)
    except (Unreadable, MalformedReview) as exc:
        log.warning("%s: not an AdmissionReview: %s", request.path, printable(str(exc)))
        raise web.HTTPBadRequest(text=f"not an AdmissionReview: {exc}") from None
    return web.json_response(answer(review, mutate=mutate, require_user=require_user))


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_webhook_app(*, require_user: bool = True) -> web.Application:
    """``require_user``: a new share pod must state its share's one UID."""

    async def mutate(request: web.Request) -> web.Response:
        return await _review(request, mutate=True, require_user=require_user)

    async def validate(request: web.Request) -> web.Response:
        return await _review(request, mutate=False, require_user=require_user)

    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/validate", validate)
    app.router.add_get("/healthz", _healthz)
    return app


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context from a PEM certificate chain and its key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("webhook", f"cannot load {cert_file} with {key_file}: {exc}") from exc
    return context


async def serve_webhook(
    host: str, port: int, cert_file: str, key_file: str, *, require_user: bool = True
) -> None:
    """Serve the webhook over HTTPS until cancelled."""
    context = tls_context(cert_file, key_file)
    runner = web.AppRunner(build_webhook_app(require_user=require_user), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=context).start()
        log.info("webhook serving on https://%s:%d", host, port)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
