"""What a pod asks of the agents, read from its annotations and its ``gpushare.io/share``
units. Pure: no I/O.

``gpushare.io/memory`` (or ``gpushare.io/sizing``), ``gpushare.io/threads`` (required, the
active-thread percentage in (0, 100]), ``gpushare.io/priority`` (guaranteed | burstable |
best-effort; burstable if unset), ``gpushare.io/gang`` with ``gpushare.io/gang-size``
(optional; values are strings, as Kubernetes stores them). The rules:

* Memory is exactly one of ``gpushare.io/memory`` and ``gpushare.io/sizing``, within the
  agent's bounds (1 MiB to 1 PiB). ``gpushare.io/memory`` is a Kubernetes quantity:
  ``Ki Mi Gi Ti Pi Ei``, ``k M G T P E`` and exponents (``1e9``) mean what they mean in
  ``resources.limits.memory`` (``20G`` is 20 * 10^9 bytes, not 20 GiB); the agent's own
  ``20GiB`` and ``20GB`` are read too, ``m`` (milli) is refused; fractions round down.
  Numbers are written in ASCII digits, as Kubernetes reads them (Python's ``int``,
  ``float`` and ``Decimal`` would read Arabic-Indic or full-width digits as well: they are
  never handed any).
* ``gpushare.io/sizing`` is a YAML or JSON object of at most 1024 characters, the agent's
  Sizing message (:mod:`agent.legacy.cluster.sizing_annotation`);
  :func:`agent.admission.sizing.size` makes the memory of it.
* A gang is ``gpushare.io/gang`` (the agent's identifier rule: letters, digits and
  ``._:/@+=-``) with ``gpushare.io/gang-size``, a whole number from 1 to
  :data:`MAX_GANG_SIZE`; neither comes alone. A gang of one is allowed: it is trivially all
  or nothing, and a templated job scaled down to one replica should not be refused. The
  agents know it as ``<namespace>/<gang>``, which must fit their 128 characters.
* One share per pod: the agent grants one lease per request and a pod is one request (its
  UID is the request id), so exactly one container (init containers counted) requests
  ``gpushare.io/share: 1``. More is refused rather than silently served by one lease; a pod
  that asks with annotations but requests no share is refused too.
* Tenant and trust domain are the pod's namespace: a namespace's pods form one trust
  domain, and no annotation changes that.
* The share's user: the UIDs (``runAsUser``, :mod:`agent.core.podusers`) of the containers
  that ask ``gpushare.io/share`` (every container, for a pod that asks by annotation only);
  ``run_as_uid`` is the one UID they all state, else None. MPS runs one server per UID at
  a time, so with ``require_user`` each of them must state it, and the same one
  (:func:`check_one_user`).
* The request id is ``metadata.uid``. A new pod has none at admission (the API server sets
  it after the mutating webhooks), so ``request_id`` may be empty in the webhook; the
  scheduler extender and the binder always see it.

Every refusal is an :class:`AnnotationError` naming the annotation and the reason; a value
it repeats is cut and quoted (:func:`agent.legacy.cluster.bounded.shown`), so a long number or a
nested value is never echoed in full.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agent.admission.sizing import SizingSpec
from agent.core.errors import UnitError, ValidationError
from agent.core.podusers import FIX, Users, run_as_user, users_of
from agent.core.quantity import quantity
from agent.core.types import PriorityClass
from agent.core.units import parse_bytes
from agent.legacy.cluster.bounded import shown
from agent.legacy.cluster.sizing_annotation import (
    ASCII_NUMBER,
    SPACES,
    SizingError,
    parse_sizing,
    sized_bytes,
)
from agent.legacy.podleases import LEASE_ANNOTATION  # the lease id, set by the binder

PREFIX = "gpushare.io/"
MEMORY_ANNOTATION = "gpushare.io/memory"
SIZING_ANNOTATION = "gpushare.io/sizing"
THREADS_ANNOTATION = "gpushare.io/threads"
PRIORITY_ANNOTATION = "gpushare.io/priority"
GANG_ANNOTATION = "gpushare.io/gang"
GANG_SIZE_ANNOTATION = "gpushare.io/gang-size"
# What a pod asks with: set by its author.
REQUEST_ANNOTATIONS = (
    MEMORY_ANNOTATION, SIZING_ANNOTATION, THREADS_ANNOTATION,
    PRIORITY_ANNOTATION, GANG_ANNOTATION, GANG_SIZE_ANNOTATION,
)  # fmt: skip
NODE_AGENT_ANNOTATION = "gpushare.io/node-agent"  # the agent target the lease is on
# What the cluster side writes: never set by a pod's author.
CLUSTER_ANNOTATIONS = (LEASE_ANNOTATION, NODE_AGENT_ANNOTATION)

FINALIZER = "gpushare.io/lease"
RESOURCE = "gpushare.io/share"
SCHEDULER_NAME = "gpushare"

SHARES_PER_POD = 1
MIN_GANG_SIZE = 1
MAX_GANG_SIZE = 10_000
# The agent's bounds (agent.api.validate): memory limits are whole MiB, nothing is > 1 PiB;
# identifiers are at most 128 characters of letters, digits and ._:/@+=-.
MIN_MEMORY_BYTES = 2**20
MAX_MEMORY_BYTES = 2**50
MAX_IDENTIFIER = 128
_IDENTIFIER_RE = re.compile(r"^[A-Za-z0-9._:/@+=-]+$")
MAX_VALUE = 64  # characters of a scalar annotation (memory, threads, priority, gang-size)
MAX_SIZING = 1024  # characters of gpushare.io/sizing
MAX_SHARE_UNITS = 999_999  # gpushare.io/share of one container, read (one is allowed)
CONTAINER_KINDS = ("initContainers", "containers")
_LIMITS = {SIZING_ANNOTATION: MAX_SIZING, GANG_ANNOTATION: MAX_IDENTIFIER}


class AnnotationError(ValidationError):
    """A pod's gpushare.io/ annotation (or share request) is wrong: ``field`` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(field, reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class PodAsk:
    memory_bytes: int
    sizing: SizingSpec | None  # what memory_bytes was sized from, if it was
    thread_pct: float
    priority: PriorityClass
    gang_id: str  # "" for none
    gang_size: int  # 0 for none
    tenant: str  # the namespace
    trust_domain: str  # the namespace
    request_id: str  # metadata.uid; "" before the API server has set it (the webhook)
    shares: int
    users: Users  # the UIDs the share's containers run as (share_users)

    @property
    def run_as_uid(self) -> int | None:
        """The share's one UID; None where its containers do not all state the same one."""
        return self.users.uid


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def sequence(value: object) -> list[Any]:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def containers(
    pod: Mapping[str, Any], kinds: tuple[str, ...] = CONTAINER_KINDS
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each container of ``kinds`` with its path: ``("spec.containers[0]", container)``."""
    spec = mapping(pod.get("spec"))
    for kind in kinds:
        for index, container in enumerate(sequence(spec.get(kind))):
            yield f"spec.{kind}[{index}]", mapping(container)


def share_request(container: Mapping[str, Any]) -> object | None:
    """The container's ``gpushare.io/share`` (limits, else requests), None if it has none."""
    resources = mapping(container.get("resources"))
    for part in ("limits", "requests"):
        value: object = mapping(resources.get(part)).get(RESOURCE)
        if value is not None:
            return value
    return None


def wants_share(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks for a GPU share: a container (init containers included) names
    ``gpushare.io/share``, or the pod carries a gpushare.io/ request annotation."""
    if any(share_request(c) is not None for _, c in containers(pod)):
        return True
    annotations = mapping(mapping(pod.get("metadata")).get("annotations"))
    return any(name in annotations for name in REQUEST_ANNOTATIONS)


def parse_ask(pod: Mapping[str, Any], *, require_user: bool = False) -> PodAsk:
    """What the pod asks for; :class:`AnnotationError` for the first rule it breaks (with
    ``require_user``, :func:`check_one_user`'s too)."""
    meta = mapping(pod.get("metadata"))
    annotations = _annotations(meta)
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise AnnotationError("metadata.namespace", "is required: it is the tenant")
    memory_bytes, sizing = _memory(annotations)
    thread_pct = _threads(annotations.get(THREADS_ANNOTATION))
    priority = _priority(annotations.get(PRIORITY_ANNOTATION))
    gang_id, gang_size = _gang(annotations, namespace)
    uid = meta.get("uid")
    ask = PodAsk(
        memory_bytes=memory_bytes,
        sizing=sizing,
        thread_pct=thread_pct,
        priority=priority,
        gang_id=gang_id,
        gang_size=gang_size,
        tenant=namespace,
        trust_domain=namespace,
        request_id=uid if isinstance(uid, str) else "",
        shares=_shares(pod),
        users=share_users(pod),
    )
    if require_user:
        check_one_user(pod)
    return ask


def _annotations(meta: Mapping[str, Any]) -> dict[str, str]:
    annotations = mapping(meta.get("annotations"))
    found: dict[str, str] = {}
    for name in (n for n in REQUEST_ANNOTATIONS if annotations.get(n) is not None):
        value, limit = annotations[name], _LIMITS.get(name, MAX_VALUE)
        if not isinstance(value, str):
            raise AnnotationError(name, f"must be a string (got {type(value).__name__})")
        if len(value) > limit:
            raise AnnotationError(name, f"is longer than {limit} characters")
        found[name] = value
    return found


# -- memory ------------------------------------------------------------------------------

_AGENT_SPELLING_RE = re.compile(r"[\d.]+[ \t]*[kKmMgGtT]?i?[bB]", re.ASCII)  # 20GiB, 100b
EXAMPLES = "examples: 20Gi, 512Mi, 1.5Gi, 20G, 20GiB"


def parse_quantity(text: str) -> int:
    """Bytes of a Kubernetes quantity (``20Gi``, ``512Mi``, ``20G``, ``1.5Gi``, ``1e9``: the
    agent's one parser, :func:`agent.core.quantity.quantity`) or of the agent's spelling
    (``20GiB``, ``20GB``), rounded down; :class:`UnitError` else. Stricter than a quantity
    anywhere else: at most :data:`MAX_VALUE` characters, only spaces and tabs around it,
    no milli (``1m`` is a thousandth of a byte: a typo for ``1Mi``), nothing negative."""
    if len(text) > MAX_VALUE:
        raise UnitError(f"{shown(text)} is longer than {MAX_VALUE} characters")
    value = text.strip(SPACES)
    if _AGENT_SPELLING_RE.fullmatch(value):
        return parse_bytes(value)
    try:  # a newline or a Unicode space around it: refused, where the parser drops it
        exact = quantity(value) if value == value.strip() else None
    except UnitError:
        exact = None
    if exact is None:
        raise UnitError(f"cannot read {shown(text)} as a quantity ({EXAMPLES})")
    if value.endswith("m"):
        raise UnitError(f"{shown(text)}: 'm' is milli (a thousandth of a byte); write Mi for MiB")
    if value.startswith("-"):
        raise UnitError(f"{shown(text)} is negative")
    return int(exact)


def _memory(annotations: Mapping[str, str]) -> tuple[int, SizingSpec | None]:
    memory, sizing = annotations.get(MEMORY_ANNOTATION), annotations.get(SIZING_ANNOTATION)
    if memory is not None and sizing is not None:
        raise AnnotationError(MEMORY_ANNOTATION, f"give it or {SIZING_ANNOTATION}, not both")
    if sizing is not None:
        try:
            spec = parse_sizing(sizing)
            return _bounded(SIZING_ANNOTATION, sized_bytes(spec), "sizes to"), spec
        except SizingError as exc:
            raise AnnotationError(SIZING_ANNOTATION, str(exc)) from None
    if memory is None:
        reason = f"is required (or {SIZING_ANNOTATION}): the device memory to hold"
        raise AnnotationError(MEMORY_ANNOTATION, reason)
    try:
        return _bounded(MEMORY_ANNOTATION, parse_quantity(memory), "is"), None
    except UnitError as exc:
        raise AnnotationError(MEMORY_ANNOTATION, str(exc)) from None


def _bounded(field: str, value: int, verb: str) -> int:
    if value < MIN_MEMORY_BYTES:
        raise AnnotationError(field, f"{verb} {value} bytes, under 1 MiB (the least MPS can set)")
    if value > MAX_MEMORY_BYTES:
        figure = f"{value} bytes" if value < 10**21 else "more than 10^21 bytes"
        raise AnnotationError(field, f"{verb} {figure}, over 1 PiB (larger than any GPU)")
    return value


# -- threads, priority, gang, shares -----------------------------------------------------

_PRIORITIES = {p.value: p for p in PriorityClass}


def _threads(value: str | None) -> float:
    if value is None:
        reason = "is required: the active-thread percentage, a number in (0, 100]"
        raise AnnotationError(THREADS_ANNOTATION, reason)
    text = value.strip(SPACES)
    number = float(text) if ASCII_NUMBER.fullmatch(text) else math.nan
    if not math.isfinite(number) or not 0.0 < number <= 100.0:
        reason = f"must be a number in (0, 100] (got {shown(value)})"
        raise AnnotationError(THREADS_ANNOTATION, reason)
    return number


def _priority(value: str | None) -> PriorityClass:
    found = PriorityClass.BURSTABLE if value is None else _PRIORITIES.get(value.strip())
    if found is None:
        reason = f"must be guaranteed, burstable or best-effort (got {shown(value)})"
        raise AnnotationError(PRIORITY_ANNOTATION, reason)
    return found


def identifier(value: str, field: str) -> str:
    """The agent's identifier rule: 1 to 128 of letters, digits and ``._:/@+=-``."""
    if not value:
        raise AnnotationError(field, "is empty")
    if len(value) > MAX_IDENTIFIER:
        raise AnnotationError(field, f"is longer than {MAX_IDENTIFIER} characters")
    if not _IDENTIFIER_RE.fullmatch(value):
        reason = f"may hold only letters, digits and ._:/@+=- (got {shown(value)})"
        raise AnnotationError(field, reason)
    return value


def _gang(annotations: Mapping[str, str], namespace: str) -> tuple[str, int]:
    gang, count = annotations.get(GANG_ANNOTATION), annotations.get(GANG_SIZE_ANNOTATION)
    if gang is None and count is None:
        return "", 0
    if gang is None:
        raise AnnotationError(GANG_SIZE_ANNOTATION, f"is set without {GANG_ANNOTATION}")
    if count is None:
        raise AnnotationError(GANG_ANNOTATION, f"is set without {GANG_SIZE_ANNOTATION}")
    gang_id = identifier(gang, GANG_ANNOTATION)
    if len(namespace) + 1 + len(gang_id) > MAX_IDENTIFIER:
        reason = f"is too long: {namespace}/<gang> must fit {MAX_IDENTIFIER} characters"
        raise AnnotationError(GANG_ANNOTATION, reason)
    text = count.strip()
    members = int(text) if text.isascii() and text.isdigit() and len(text) <= 6 else 0
    if not MIN_GANG_SIZE <= members <= MAX_GANG_SIZE:
        reason = f"must be a whole number from {MIN_GANG_SIZE} to {MAX_GANG_SIZE}"
        raise AnnotationError(GANG_SIZE_ANNOTATION, f"{reason} (got {shown(count)})")
    return gang_id, members


def share_count(value: object, where: str) -> int:
    """A container's ``gpushare.io/share`` as a whole number of units (at most
    :data:`MAX_SHARE_UNITS` are read; a pod may ask for one)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SHARE_UNITS:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 6:
        return int(value)
    raise AnnotationError(RESOURCE, f"{where} asks for {shown(value)}: must be a whole number")


def _shares(pod: Mapping[str, Any]) -> int:
    total = sum(
        share_count(value, where)
        for where, container in containers(pod)
        if (value := share_request(container)) is not None
    )
    if total == 0:
        reason = "no container requests it, yet the pod asks with gpushare.io/ annotations"
        raise AnnotationError(RESOURCE, f"{reason}: give one container limits {RESOURCE}: 1")
    if total > SHARES_PER_POD:
        reason = f"the pod requests {total} in all; a pod gets one lease, so one container"
        raise AnnotationError(RESOURCE, f"{reason} requests {RESOURCE}: 1")
    return total


# -- the share's user --------------------------------------------------------------------


def share_containers(pod: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The containers that use the pod's share, with their paths: those that ask
    ``gpushare.io/share``, or every container of a pod that asks by annotation only."""
    every = list(containers(pod))
    return [(w, c) for w, c in every if share_request(c) is not None] or every


def share_users(pod: Mapping[str, Any]) -> Users:
    """The users of the containers that use the pod's share (:func:`share_containers`)."""
    if any(share_request(c) is not None for _, c in containers(pod)):
        return users_of(pod, lambda c: share_request(c) is not None)
    return users_of(pod)


def check_one_user(pod: Mapping[str, Any]) -> None:
    """Each container of the share states its UID, the same one: :class:`AnnotationError`
    naming the ``runAsUser`` of the first that does not."""
    first: tuple[str, int] | None = None
    for where, container in share_containers(pod):
        uid, field = run_as_user(pod, container), f"{where}.securityContext.runAsUser"
        if uid is None:
            raise AnnotationError(field, f"the GPU share's user is not stated: {FIX}")
        if first is None:
            first = (where, uid)
        elif uid != first[1]:
            reason = f"is {uid}, but {first[0]} runs as {first[1]}: a share has one user; {FIX}"
            raise AnnotationError(field, reason)
