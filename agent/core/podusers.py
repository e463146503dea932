"""Which user a pod's containers run as, read from the pod's JSON. Pure.

A container's processes run as ``securityContext.runAsUser`` of the container, else of the
pod. Neither said, they run as the image's ``USER``, which the API does not show: such a
container's UID is *unstated*. The one-user rule of MPS (:mod:`agent.admission.tenancy`)
needs the share's UID, so the share paths read it here: the extender from the containers
that ask ``gpushare.io/share``, the DRA driver from the containers that use the claim
(``resources.claims``) of each pod the claim is reserved for.

A value that is not a UID (not an integer, negative, over 4294967294, a JSON boolean)
counts as unstated; the API server itself takes 0 to 2147483647.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

MAX_UID = 4294967294  # the largest UID a share may state (uid_t minus the -1 marker)
KINDS = ("initContainers", "containers")
FIX = (
    "set securityContext.runAsUser on the pod (spec.securityContext) or on each container "
    "that uses the GPU share: one MPS server serves one user at a time"
)


@dataclass(frozen=True, slots=True)
class Users:
    """The UIDs the chosen containers run as, and the containers whose UID is unstated
    (as ``pod/container`` when read from several pods, else ``container``)."""

    uids: frozenset[int] = frozenset()
    unstated: tuple[str, ...] = ()

    @property
    def uid(self) -> int | None:
        """The one UID, where every chosen container states the same one; else None."""
        if self.unstated or len(self.uids) != 1:
            return None
        return next(iter(self.uids))

    def __or__(self, other: Users) -> Users:
        return Users(self.uids | other.uids, self.unstated + other.unstated)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def stated_uid(value: object) -> int | None:
    """``value`` as a UID, or None where the API server would not take it."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_UID else None


def run_as_user(pod: Mapping[str, Any], container: Mapping[str, Any]) -> int | None:
    """The UID ``container`` of ``pod`` runs as, None where neither says."""
    own = _mapping(container.get("securityContext")).get("runAsUser")
    if own is not None:
        return stated_uid(own)
    spec = _mapping(pod.get("spec"))
    return stated_uid(_mapping(spec.get("securityContext")).get("runAsUser"))


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    spec = _mapping(pod.get("spec"))
    for kind in KINDS:
        for container in _sequence(spec.get(kind)):
            yield _mapping(container)


def users_of(
    pod: Mapping[str, Any], chosen: Callable[[Mapping[str, Any]], bool] = lambda _: True
) -> Users:
    """The users of the pod's containers that ``chosen`` picks (init containers too)."""
    uids: set[int] = set()
    unstated: list[str] = []
    for container in _containers(pod):
        if not chosen(container):
            continue
        uid = run_as_user(pod, container)
        if uid is None:
            unstated.append(str(container.get("name") or "?"))
        else:
            uids.add(uid)
    return Users(frozenset(uids), tuple(unstated))


def pod_claim_names(pod: Mapping[str, Any], claim_name: str) -> frozenset[str]:
    """The pod's own names (``spec.resourceClaims[].name``) for the ResourceClaim
    ``claim_name``: named directly (``resourceClaimName``) or generated from a template
    (``status.resourceClaimStatuses``)."""
    names = {
        str(entry.get("name"))
        for entry in map(_mapping, _sequence(_mapping(pod.get("spec")).get("resourceClaims")))
        if entry.get("resourceClaimName") == claim_name
    }
    names |= {
        str(entry.get("name"))
        for entry in map(
            _mapping, _sequence(_mapping(pod.get("status")).get("resourceClaimStatuses"))
        )
        if entry.get("resourceClaimName") == claim_name
    }
    return frozenset(names)


def extended_containers(pod: Mapping[str, Any], claim_name: str) -> frozenset[str]:
    """The containers the claim made for the pod's extended resources (DRAExtendedResource:
    ``status.extendedResourceClaimStatus``) serves, when it is ``claim_name``."""
    status = _mapping(_mapping(pod.get("status")).get("extendedResourceClaimStatus"))
    if status.get("resourceClaimName") != claim_name:
        return frozenset()
    mappings = map(_mapping, _sequence(status.get("requestMappings")))
    return frozenset(str(m.get("containerName")) for m in mappings)


def uses_claim(container: Mapping[str, Any], pod_names: Collection[str]) -> bool:
    """Whether ``container`` lists one of ``pod_names`` in ``resources.claims``."""
    claims = _sequence(_mapping(container.get("resources")).get("claims"))
    return any(_mapping(c).get("name") in pod_names for c in claims)


def asks_resource(container: Mapping[str, Any], names: Collection[str]) -> bool:
    """Whether ``container`` asks one of the extended resources ``names``."""
    resources = _mapping(container.get("resources"))
    return any(
        name in _mapping(resources.get(part)) for part in ("limits", "requests") for name in names
    )


def claim_users(pod: Mapping[str, Any], claim_name: str, extended: Collection[str] = ()) -> Users:
    """The users of the pod's containers that use the ResourceClaim ``claim_name``, named
    ``pod/container``: those that name it in ``resources.claims``, or that its mapping of
    extended resources names. A pod that names the claim nowhere yet (the scheduler
    writes the mapping of a claim for extended resources after the claim) counts the
    containers that ask one of the ``extended`` resources; a pod that names it but whose
    containers do not use it (no container gets its devices) counts none."""
    names = pod_claim_names(pod, claim_name)
    mapped = extended_containers(pod, claim_name)

    def using(container: Mapping[str, Any]) -> bool:
        if not names and not mapped:
            return asks_resource(container, extended)
        return uses_claim(container, names) or container.get("name") in mapped

    users = users_of(pod, using)
    pod_name = str(_mapping(pod.get("metadata")).get("name") or "?")
    return Users(users.uids, tuple(f"{pod_name}/{c}" for c in users.unstated))


def claim_requests(pod: Mapping[str, Any], claim_name: str) -> dict[str, frozenset[str] | None]:
    """Per container that uses the ResourceClaim ``claim_name``: the claim's requests it is
    given (``resources.claims[].request``; None: every request of the claim), or those its
    extended resources map to (DRAExtendedResource)."""
    names = pod_claim_names(pod, claim_name)
    status = _mapping(_mapping(pod.get("status")).get("extendedResourceClaimStatus"))
    mapped: dict[str, set[str]] = {}
    if status.get("resourceClaimName") == claim_name:
        for m in map(_mapping, _sequence(status.get("requestMappings"))):
            mapped.setdefault(str(m.get("containerName")), set()).add(str(m.get("requestName")))
    found: dict[str, frozenset[str] | None] = {}
    for container in _containers(pod):
        name = str(container.get("name") or "?")
        entries = [
            e
            for e in map(_mapping, _sequence(_mapping(container.get("resources")).get("claims")))
            if e.get("name") in names
        ]
        if any(not e.get("request") for e in entries):
            found[name] = None  # the whole claim
            continue
        requests = set(mapped.get(name, ())) | {str(e.get("request")) for e in entries}
        if requests:
            found[name] = frozenset(requests)
    return found
