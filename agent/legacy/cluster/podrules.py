"""What a pod with a GPU share may be: the rules the admission webhook
(:mod:`agent.legacy.cluster.webhook`) holds it to. Pure: no I/O.

Each rule that a pod breaks is a :class:`Refusal` with the field and the reason, which
``kubectl apply`` prints as it is:

* 400: a bad gpushare.io/ annotation or share request (:func:`parse_ask`), a pod that
  names another scheduler than ``gpushare``, or (with ``require_user``, ``kube serve
  --run-as-user required``) a share whose containers do not all state one UID in
  ``securityContext.runAsUser``, theirs or the pod's (:func:`check_one_user`: MPS runs
  one server per UID at a time).
* 403: a privileged container (``securityContext.privileged``), a capability added beyond
  Pod Security's baseline profile (:data:`BASELINE_CAPABILITIES`: ``SYS_ADMIN``,
  ``SYS_PTRACE``, ``NET_ADMIN``, ``ALL``, ...); the node's namespaces (``hostPID``,
  ``hostIPC``, whose ``/dev/shm`` holds MPS's shared memory, ``hostNetwork``); a container
  that sets ``CUDA_MPS_*``, ``GPUSHARE_*``, ``NVIDIA_*`` or ``CUDA_VISIBLE_DEVICES`` itself
  (``env``, or an ``envFrom`` prefix that reaches them), which would choose its own devices
  or MPS server over the lease's (the kubelet puts the device plugin's variables first and
  the container's own after them, so the container's win); an ``envFrom`` without a
  prefix, since the keys of its ConfigMap or Secret cannot be seen here and any of them
  could be one of those; a ``hostPath`` volume of the agent's host directories (or of a
  directory above them, which holds them too), or a pod that sets ``spec.nodeName`` itself
  (it would bypass the scheduler and its lease).

Any pod, sharing or not, that is created with ``gpushare.io/lease`` or
``gpushare.io/node-agent`` is refused (403): the cluster side writes them, and the lease
controller releases the lease a pod's annotation names.

A change is judged by what it changes (:func:`check_update`), so a pod admitted before a
rule existed can still lose its finalizer and go: once the pod is bound its gpushare.io/
request annotations and its ``gpushare.io/lease`` may not change (403); before that,
changed request annotations must still parse. Each ephemeral container added to a share
pod (``kubectl debug``) is held to the container rules (:func:`check_ephemeral`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping
from typing import Any

from agent.legacy.cluster.annotations import (
    CLUSTER_ANNOTATIONS,
    REQUEST_ANNOTATIONS,
    SCHEDULER_NAME,
    AnnotationError,
    containers,
    mapping,
    parse_ask,
    sequence,
    wants_share,
)
from agent.legacy.cluster.bounded import shown
from agent.legacy.podleases import LEASE_ANNOTATION

DEFAULT_SCHEDULER = "default-scheduler"
# Variables a share pod's containers may not set: (name, a prefix?, why)
_LEASE = "the agent sets it for the lease, not the pod"
RESERVED_ENV: tuple[tuple[str, bool, str], ...] = (
    ("CUDA_MPS_", True, f"CUDA_MPS_*: {_LEASE} (its MPS server, threads and memory)"),
    ("GPUSHARE_", True, f"GPUSHARE_*: {_LEASE}"),
    ("NVIDIA_", True, "NVIDIA_*: the NVIDIA runtime reads them to choose the devices and "
     "driver features the container gets; the agent sets NVIDIA_VISIBLE_DEVICES to the "
     "lease's device"),
    ("CUDA_VISIBLE_DEVICES", False, "it chooses the GPUs CUDA uses; the lease's device is "
     "the container's one GPU"),
)  # fmt: skip
_UNPREFIXED = (
    "a pod with a GPU share may not load a ConfigMap's or Secret's keys without a prefix: "
    "the webhook cannot read them, and a key such as NVIDIA_VISIBLE_DEVICES or CUDA_MPS_* "
    "would override the lease's; give it a prefix such as APP_"
)
# Pod Security Standards, baseline profile: the only capabilities a container may add
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})  # fmt: skip
# spec field -> what sharing it would give the pod
HOST_NAMESPACES = {
    "hostIPC": "IPC namespace: its /dev/shm holds the MPS server's shared memory",
    "hostPID": "process namespace: it would see and signal every process of the node",
    "hostNetwork": "network namespace",
}
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


class Refusal(Exception):
    """The pod is refused: ``code`` (400 or 403) and ``message`` ("<field>: <reason>")."""

    def __init__(self, code: int, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.code = code
        self.message = f"{field}: {reason}"


def text_of(value: object) -> str:
    return value if isinstance(value, str) else ""


def check_new_pod(pod: Mapping[str, Any], *, require_user: bool = True) -> None:
    """A new pod; with ``require_user``, a share pod states its share's one UID."""
    annotations = _annotations(pod)
    for name in CLUSTER_ANNOTATIONS:
        if name in annotations:
            raise Refusal(
                403, name, "is written by the gpushare scheduler; a new pod may not set it"
            )
    if not wants_share(pod):
        return
    _parse(pod, require_user=require_user)
    spec = mapping(pod.get("spec"))
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if scheduler not in (DEFAULT_SCHEDULER, SCHEDULER_NAME):
        reason = f"a pod with a GPU share is scheduled by {SCHEDULER_NAME}, not {shown(scheduler)}"
        raise Refusal(400, "spec.schedulerName", reason)
    if spec.get("nodeName"):
        reason = f"a pod with a GPU share is placed by the {SCHEDULER_NAME} scheduler, not set"
        raise Refusal(403, "spec.nodeName", reason)
    _check_host_namespaces(spec)
    for where, container in containers(pod, ALL_CONTAINER_KINDS):
        _check_container(where, container)
    _check_volumes(spec)


def check_ephemeral(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """The ephemeral containers added to a share pod (``kubectl debug``) keep the rules of
    its other containers. Only those added now are judged: one added before a rule existed
    does not stop the next."""
    if not (wants_share(new) or wants_share(old)):
        return
    before = sequence(mapping(old.get("spec")).get("ephemeralContainers"))
    for where, container in containers(new, ("ephemeralContainers",)):
        if container not in before:
            _check_container(where, container)


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


def _parse(pod: Mapping[str, Any], *, require_user: bool = False) -> None:
    try:
        parse_ask(pod, require_user=require_user)
    except AnnotationError as exc:
        raise Refusal(400, exc.field, exc.reason) from None


def _check_host_namespaces(spec: Mapping[str, Any]) -> None:
    for field, what in HOST_NAMESPACES.items():
        if spec.get(field) not in (None, False):
            reason = f"a pod with a GPU share may not share the node's {what}"
            raise Refusal(403, f"spec.{field}", reason)


def _check_container(where: str, container: Mapping[str, Any]) -> None:
    _check_privileges(where, container)
    _check_env(where, container)


def _check_privileges(where: str, container: Mapping[str, Any]) -> None:
    context = mapping(container.get("securityContext"))
    if context.get("privileged") is True:
        reason = "a pod with a GPU share may not run a privileged container"
        raise Refusal(403, f"{where}.securityContext.privileged", reason)
    added = sequence(mapping(context.get("capabilities")).get("add"))
    for index, capability in enumerate(added):
        name = text_of(capability).upper().removeprefix("CAP_")
        if name not in BASELINE_CAPABILITIES:
            reason = (
                f"a pod with a GPU share may not add {shown(capability)}: only the "
                "capabilities of Pod Security's baseline profile "
                f"({', '.join(sorted(BASELINE_CAPABILITIES))})"
            )
            raise Refusal(403, f"{where}.securityContext.capabilities.add[{index}]", reason)


def _check_env(where: str, container: Mapping[str, Any]) -> None:
    for index, variable in enumerate(sequence(container.get("env"))):
        name = text_of(mapping(variable).get("name"))
        why = next(_reserved(name.upper(), by_prefix=False), None)
        if why is not None:
            raise Refusal(403, f"{where}.env[{index}].name", f"{shown(name)}: {why}")
    for index, source in enumerate(sequence(container.get("envFrom"))):
        prefix = text_of(mapping(source).get("prefix"))
        if not prefix:
            raise Refusal(403, f"{where}.envFrom[{index}].prefix", _UNPREFIXED)
        why = next(_reserved(prefix.upper(), by_prefix=True), None)
        if why is not None:
            reason = f"{shown(prefix)} can name variables a share pod may not set: {why}"
            raise Refusal(403, f"{where}.envFrom[{index}].prefix", reason)


def _reserved(name: str, *, by_prefix: bool) -> Iterator[str]:
    """Why the variable ``name``, or with ``by_prefix`` some variable whose name starts
    with it, is the lease's: one reason per rule of :data:`RESERVED_ENV` it meets."""
    for reserved, is_prefix, why in RESERVED_ENV:
        reaches = by_prefix and reserved.startswith(name)  # PREFIX + a key can be reserved
        if reaches or (name.startswith(reserved) if is_prefix else name == reserved):
            yield why


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
