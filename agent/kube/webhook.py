"""The admission webhook for pods (``admission.k8s.io/v1`` AdmissionReview).

``POST /mutate`` (a MutatingWebhookConfiguration, CREATE) and ``POST /validate`` (a
ValidatingWebhookConfiguration, CREATE and UPDATE) check a pod that wants a GPU share
(:func:`agent.kube.annotations.wants_share`) and refuse it with the field and the reason,
which ``kubectl apply`` prints as it is:

* 400: a bad gpushare.io/ annotation or share request (:func:`parse_ask`), or a pod that
  names another scheduler than ``gpushare``.
* 403: a privileged container (``securityContext.privileged``, or the capability
  ``SYS_ADMIN`` or ``ALL``), a container that sets ``CUDA_MPS_*`` or ``GPUSHARE_*`` itself
  (``env``, or an ``envFrom`` prefix that reaches them: the keys of a ConfigMap or Secret
  without a prefix cannot be seen here), a ``hostPath`` volume of the agent's host
  directories (or of a directory above them, which holds them too), or a pod that sets
  ``spec.nodeName`` itself (it would bypass the scheduler and its lease).

Any pod, sharing or not, that is created with ``gpushare.io/lease`` or
``gpushare.io/node-agent`` is refused (403): the cluster side writes them, and the lease
controller releases the lease a pod's annotation names.

On CREATE, ``/mutate`` answers a JSONPatch that sets ``spec.schedulerName: gpushare``
(when unset or ``default-scheduler``) and adds the finalizer ``gpushare.io/lease`` (once).

On UPDATE only the change is judged, so a pod admitted before a rule existed can still
lose its finalizer and go: once the pod is bound (the old pod has ``spec.nodeName``) its
gpushare.io/ request annotations and its ``gpushare.io/lease`` may not change (403); before
that, changed request annotations must still parse. Subresources (``status``, ...) and
DELETE are allowed. A review that is not an AdmissionReview is answered HTTP 400.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import posixpath
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agent.core.errors import ConfigError
from agent.kube.annotations import (
    CLUSTER_ANNOTATIONS,
    FINALIZER,
    REQUEST_ANNOTATIONS,
    SCHEDULER_NAME,
    AnnotationError,
    containers,
    mapping,
    parse_ask,
    sequence,
    shown,
    wants_share,
)
from agent.kubelet.port import LEASE_ANNOTATION

log = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
DEFAULT_SCHEDULER = "default-scheduler"
RESERVED_ENV_PREFIXES = ("CUDA_MPS_", "GPUSHARE_")
FORBIDDEN_CAPABILITIES = frozenset({"SYS_ADMIN", "ALL"})
# The agent's state and runtime directories (MPS pipes, its socket) and the kubelet's
# device-plugin and pod-resources sockets.
AGENT_HOST_PATHS = (
    "/run/gpushare",
    "/var/run/gpushare",
    "/var/lib/gpushare",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/pod-resources",
)
ALL_CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
MAX_REVIEW_BYTES = 8 * 2**20  # a pod and its old copy fit well within
_REASONS = {400: "BadRequest", 403: "Forbidden"}


class Refusal(Exception):
    """The pod is refused: ``code`` (400 or 403) and ``message`` ("<field>: <reason>")."""

    def __init__(self, code: int, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.code = code
        self.message = f"{field}: {reason}"


class MalformedReview(Exception):
    """The body is not an ``admission.k8s.io/v1`` AdmissionReview with a request."""


@dataclass(frozen=True, slots=True)
class Review:
    uid: str
    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    namespace: str
    kind: str  # request.kind.kind: "Pod" for ours
    sub_resource: str
    pod: Mapping[str, Any]  # request.object, namespace filled in
    old: Mapping[str, Any]  # request.oldObject ({} unless UPDATE)


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
        kind=str(mapping(request.get("kind")).get("kind", "")),
        sub_resource=str(request.get("subResource") or ""),
        pod=_in_namespace(mapping(pod), namespace),
        old=_in_namespace(mapping(old), namespace),
    )


def _in_namespace(pod: Mapping[str, Any], namespace: object) -> Mapping[str, Any]:
    """A new pod's object may leave metadata.namespace to the request's."""
    meta = mapping(pod.get("metadata"))
    if not pod or meta.get("namespace") or not isinstance(namespace, str):
        return pod
    return {**pod, "metadata": {**meta, "namespace": namespace}}


# -- the checks --------------------------------------------------------------------------


def check(review: Review) -> None:
    """Raise :class:`Refusal` for a pod this review may not create or change."""
    if review.kind != "Pod" or review.sub_resource:
        return
    if review.operation == "CREATE":
        check_new_pod(review.pod)
    elif review.operation == "UPDATE":
        check_update(review.old, review.pod)


def check_new_pod(pod: Mapping[str, Any]) -> None:
    annotations = _annotations(pod)
    for name in CLUSTER_ANNOTATIONS:
        if name in annotations:
            raise Refusal(
                403, name, "is written by the gpushare scheduler; a new pod may not set it"
            )
    if not wants_share(pod):
        return
    _parse(pod)
    spec = mapping(pod.get("spec"))
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if scheduler not in (DEFAULT_SCHEDULER, SCHEDULER_NAME):
        reason = f"a pod with a GPU share is scheduled by {SCHEDULER_NAME}, not {shown(scheduler)}"
        raise Refusal(400, "spec.schedulerName", reason)
    if spec.get("nodeName"):
        reason = f"a pod with a GPU share is placed by the {SCHEDULER_NAME} scheduler, not set"
        raise Refusal(403, "spec.nodeName", reason)
    for where, container in containers(pod, ALL_CONTAINER_KINDS):
        _check_privileges(where, container)
        _check_env(where, container)
    _check_volumes(spec)


def check_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    before, after = _annotations(old), _annotations(new)
    changed = [n for n in (*REQUEST_ANNOTATIONS, LEASE_ANNOTATION) if before.get(n) != after.get(n)]
    if not changed:
        return
    node = mapping(old.get("spec")).get("nodeName")
    if node:
        reason = f"cannot change on a pod bound to node {shown(node)}: its lease is granted"
        raise Refusal(403, changed[0], reason)
    if any(n in REQUEST_ANNOTATIONS for n in changed) and wants_share(new):
        _parse(new)


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(pod.get("metadata")).get("annotations"))


def _parse(pod: Mapping[str, Any]) -> None:
    try:
        parse_ask(pod)
    except AnnotationError as exc:
        raise Refusal(400, exc.field, exc.reason) from None


def _check_privileges(where: str, container: Mapping[str, Any]) -> None:
    context = mapping(container.get("securityContext"))
    if context.get("privileged") is True:
        reason = "a pod with a GPU share may not run a privileged container"
        raise Refusal(403, f"{where}.securityContext.privileged", reason)
    added = sequence(mapping(context.get("capabilities")).get("add"))
    for index, capability in enumerate(added):
        name = str(capability).upper().removeprefix("CAP_")
        if name in FORBIDDEN_CAPABILITIES:
            reason = f"a pod with a GPU share may not add {shown(capability)}"
            raise Refusal(403, f"{where}.securityContext.capabilities.add[{index}]", reason)


def _check_env(where: str, container: Mapping[str, Any]) -> None:
    reserved = " or ".join(f"{p}*" for p in RESERVED_ENV_PREFIXES)
    for index, variable in enumerate(sequence(container.get("env"))):
        name = str(mapping(variable).get("name", ""))
        if name.upper().startswith(RESERVED_ENV_PREFIXES):
            reason = f"{shown(name)}: the agent sets {reserved} for the lease, not the pod"
            raise Refusal(403, f"{where}.env[{index}].name", reason)
    for index, source in enumerate(sequence(container.get("envFrom"))):
        prefix = str(mapping(source).get("prefix") or "").upper()
        if prefix and any(
            p.startswith(prefix) or prefix.startswith(p) for p in RESERVED_ENV_PREFIXES
        ):
            reason = f"{shown(prefix)} can name {reserved}, which the agent sets for the lease"
            raise Refusal(403, f"{where}.envFrom[{index}].prefix", reason)


def _check_volumes(spec: Mapping[str, Any]) -> None:
    for index, volume in enumerate(sequence(spec.get("volumes"))):
        path = mapping(mapping(volume).get("hostPath")).get("path")
        if not isinstance(path, str) or not path:
            continue
        clash = next(_overlaps(path), None)
        if clash is not None:
            reason = (
                f"{shown(path)} holds the agent's {clash}; a pod with a GPU share may not mount it"
            )
            raise Refusal(403, f"spec.volumes[{index}].hostPath.path", reason)


def _overlaps(path: str) -> Iterator[str]:
    """The agent's host directories that ``path`` is, is inside of, or holds."""
    normal = posixpath.normpath("/" + path.strip()).replace("//", "/")
    for protected in AGENT_HOST_PATHS:
        if normal == "/" or _within(normal, protected) or _within(protected, normal):
            yield protected


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


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


def answer(review: Review, *, mutate: bool) -> dict[str, Any]:
    """The AdmissionReview to send back."""
    response: dict[str, Any] = {"uid": review.uid, "allowed": True}
    try:
        check(review)
    except Refusal as refusal:
        log.info("refused %s of pod %s: %s", review.operation, _name(review), refusal.message)
        status = {
            "code": refusal.code,
            "reason": _REASONS[refusal.code],
            "message": refusal.message,
        }
        response.update(allowed=False, status=status)
    else:
        patch = mutation(review.pod) if mutate and review.operation == "CREATE" else []
        if patch and review.kind == "Pod" and not review.sub_resource:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def _name(review: Review) -> str:
    meta = mapping(review.pod.get("metadata") or review.old.get("metadata"))
    name = meta.get("name") or meta.get("generateName") or "?"
    return f"{review.namespace or meta.get('namespace', '')}/{name}"


async def _review(request: web.Request, *, mutate: bool) -> web.Response:
    try:
        body = json.loads(await request.read())
        review = read_review(body)
    except (ValueError, MalformedReview) as exc:  # json.JSONDecodeError is a ValueError
        raise web.HTTPBadRequest(text=f"not an AdmissionReview: {exc}") from None
    return web.json_response(answer(review, mutate=mutate))


async def _mutate(request: web.Request) -> web.Response:
    return await _review(request, mutate=True)


async def _validate(request: web.Request) -> web.Response:
    return await _review(request, mutate=False)


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_webhook_app() -> web.Application:
    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app.router.add_post("/mutate", _mutate)
    app.router.add_post("/validate", _validate)
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


async def serve_webhook(host: str, port: int, cert_file: str, key_file: str) -> None:
    """Serve the webhook over HTTPS until cancelled."""
    context = tls_context(cert_file, key_file)
    runner = web.AppRunner(build_webhook_app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=context).start()
        log.info("webhook serving on https://%s:%d", host, port)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
