"""The user a claim's shares run as: read from the pods the claim is reserved for.

The kubelet and the scheduler name a claim's consumers in ``status.reservedFor``; the
containers of those pods that use the claim (``resources.claims``) run the share's
processes, as their ``runAsUser`` (:mod:`agent.core.podusers`). One GET per reserved pod,
concurrently, only when a share of the claim is to be admitted (the binding answer, or a
Prepare that finds no lease): a node's cost follows its own claims.

- one UID: the shares' ``run_as_uid``, checked by the ledger's one-user rule;
- pods of several UIDs: refused (``USER_CONFLICT``): one MPS server serves one user at a
  time, so the claim's pods could not run side by side;
- a consumer whose UID is unstated: refused (``RUN_AS_USER_REQUIRED``, saying how to fix
  the pod) where the rule applies (an MPS device, ``dra.require_run_as_user`` on, the
  daemons not multi-user); elsewhere the share carries no UID and is not checked;
- no pod reserved (or every one gone): no UID.

The same read refuses a container that would be given two of the claim's shares
(``ONE_GPU_PER_CONTAINER``): a process reaches one MPS server.

A pod that cannot be read: :class:`StateError` (the caller tries again: the binding
controller keeps the claim owed, the kubelet retries Prepare).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.claims.shares import ShareAsk, claim_uid_of
from agent.core.errors import StateError
from agent.core.lease import Lease
from agent.core.podusers import FIX, Users, claim_requests, claim_users
from agent.core.types import Device, SharingMode
from agent.dra.claims import ClaimError, Share, metadata, reserved_pods
from agent.kubeapi.port import KubeError, NotFound, Obj, ResourceApi

MAX_NAMED = 5  # containers named in a refusal, at most
# the extended resources of the driver's DeviceClass (its extendedResourceName, and the
# name every DeviceClass has): a claim for them is the pod's by its containers' asks
EXTENDED_RESOURCES = frozenset(
    {"gpushare.io/gpu", "deviceclass.resource.kubernetes.io/gpushare.io"}
)


async def with_user(
    api: ResourceApi,
    claim: Mapping[str, object],
    asks: Sequence[ShareAsk],
    *,
    rule: bool,
    required: bool,
) -> list[ShareAsk]:
    """``asks`` (the claim's shares here to admit) with the user of the claim's pods:
    ClaimError where the claim cannot say one and must (``required``), is used by two
    where one user a server is the ``rule``, or gives one container two shares;
    StateError where a pod cannot be read."""
    if not asks:
        return []
    shares = [a.share for a in asks]
    uid = await claim_user(api, claim, shares, rule=rule, required=required)
    return [replace(a, run_as_uid=uid) for a in asks]


def on_mps(device_uuids: Iterable[str], devices: Mapping[str, Device]) -> bool:
    """Whether one of ``device_uuids`` is an MPS device (one server a user, one daemon a
    GPU), for shares to admit or leases held."""
    found = (devices.get(uuid) for uuid in device_uuids)
    return any(d is not None and d.sharing_mode is SharingMode.MPS for d in found)


async def claim_user(
    api: ResourceApi,
    claim: Mapping[str, object],
    shares: Sequence[Share],
    *,
    rule: bool,
    required: bool,
) -> int | None:
    """The UID the claim's ``shares`` here run as (None: not known, not checked), or
    ClaimError (for the users, or a container given two of them)."""
    reserved = reserved_pods(claim)
    if not reserved:
        return None
    users = await pods_users(api, claim, reserved, shares)
    return decided(users, claim_key(claim), rule=rule, required=required)


async def pods_users(
    api: ResourceApi,
    claim: Mapping[str, object],
    pods: Sequence[tuple[str, str]],
    shares: Sequence[Share] = (),
) -> Users:
    """The users of the claim's containers in ``pods`` ((name, UID) of pods reserving it;
    one GET each, concurrently; gone ones do not count), each container checked to be
    given one of ``shares`` at most."""
    meta = metadata(claim)
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    found = await asyncio.gather(*(_pod(api, namespace, n, uid) for n, uid in pods))
    users = Users()
    for pod in found:
        if pod is not None:
            one_share_per_container(pod, name, shares)
            users = users | claim_users(pod, name, EXTENDED_RESOURCES)
    return users


def claim_key(claim: Mapping[str, object]) -> str:
    meta = metadata(claim)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def one_share_per_container(
    pod: Mapping[str, Any], claim_name: str, shares: Sequence[Share]
) -> None:
    """ClaimError where a container of ``pod`` would be given two of the claim's shares
    here: a process reaches one MPS server (one pipe directory), so a container is served
    on one GPU, by one share. Pure."""
    pod_name = str(metadata(pod).get("name") or "?")
    for container, requests in claim_requests(pod, claim_name).items():
        given = [s for s in shares if requests is None or s.request in requests]
        if len(given) > 1:
            devices = ", ".join(s.device for s in given)
            raise ClaimError(
                f"ONE_GPU_PER_CONTAINER: container {pod_name}/{container} would be given "
                f"{len(given)} shares of claim {claim_name} ({devices}); "
                "a process reaches one MPS server, so a container is served on one GPU: give "
                "each container one request of one device"
            )


def decided(users: Users, claim: str, *, rule: bool, required: bool) -> int | None:
    """The claim's one UID, None, or the refusal (ClaimError): pods of two users where one
    user a server is the ``rule``, an unstated user where one is ``required``. Pure."""
    if len(users.uids) > 1 and rule:
        raise ClaimError(
            f"USER_CONFLICT: claim {claim} is used by pods of different users (UIDs "
            f"{', '.join(map(str, sorted(users.uids)))}); one MPS server serves one user at "
            "a time, so they would not run side by side: run them as one user, or give "
            "each its own claim"
        )
    if users.unstated and required:
        named = ", ".join(users.unstated[:MAX_NAMED])
        more = len(users.unstated) - MAX_NAMED
        which = "container" if len(users.unstated) == 1 else "containers"
        says = "states" if len(users.unstated) == 1 else "state"
        raise ClaimError(
            f"RUN_AS_USER_REQUIRED: claim {claim}: {which} {named}"
            f"{f' and {more} more' if more > 0 else ''} {says} no user; {FIX}"
        )
    return users.uid


async def _pod(api: ResourceApi, namespace: str, name: str, uid: str) -> Obj | None:
    """The reserved pod, None when it is gone (or replaced: another UID)."""
    try:
        pod = await api.get_pod(namespace, name)
    except NotFound:
        return None
    except KubeError as exc:
        raise StateError(f"cannot read pod {namespace}/{name}: {exc}") from exc
    if uid and metadata(pod).get("uid") != uid:
        return None
    return pod


class ClaimPods:
    """The pods each claim of this node is reserved for, as last read (the binding answer,
    Prepare, the reconcile): a shared claim's lease is bound to no one pod when admitted,
    so its processes are known by these pods' cgroups (``pods:<uid>,...``) and held to
    the share's memory like a pod's own. And the pods whose users were read (checked), so
    that the reconcile reads a pod that joined a claim once. In memory: after a restart
    the reconcile's first pass reads them again."""

    def __init__(self, *, keep_s: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self._pods: dict[str, frozenset[str]] = {}  # claim UID -> pod UIDs
        self._checked: dict[str, frozenset[str]] = {}  # claim UID -> pod UIDs read
        self._seen_at: dict[str, float] = {}  # claim UID -> when last read
        self._keep_s = keep_s  # a claim without a live lease is kept this long
        self._clock = clock

    def saw(self, claim: Mapping[str, object]) -> list[tuple[str, str]]:
        """Keep the pods the claim is reserved for now; those (name, UID) whose users were
        not read yet (:meth:`checked`)."""
        uid = str(metadata(claim).get("uid") or "")
        if not uid:
            return []
        reserved = [(n, p) for n, p in reserved_pods(claim) if p]
        self._pods[uid] = frozenset(p for _, p in reserved)
        self._seen_at[uid] = self._clock()
        checked = self._checked.get(uid, frozenset())
        return [(n, p) for n, p in reserved if p not in checked]

    def checked(self, claim: Mapping[str, object], pods: Iterable[str] | None = None) -> None:
        """The users of ``pods`` (UIDs; None: every pod the claim is reserved for) were read."""
        uid = str(metadata(claim).get("uid") or "")
        if not uid:
            return
        self.saw(claim)
        read = self._pods[uid] if pods is None else frozenset(pods)
        self._checked[uid] = self._checked.get(uid, frozenset()) | read

    def bound_now(self, leases: Iterable[Lease]) -> dict[str, str]:
        """Lease id -> ``pods:<uid>,...`` for the live claim leases bound to no workload;
        claims with no live lease, not read for a while, are forgotten."""
        bound: dict[str, str] = {}
        live: set[str] = set()
        for lease in leases:
            claim_uid = claim_uid_of(lease.request_id) if lease.held_by_claim else None
            if claim_uid is None:
                continue
            live.add(claim_uid)
            pods = self._pods.get(claim_uid)
            if pods and not lease.workload:
                bound[lease.lease_id] = "pods:" + ",".join(sorted(pods))
        old = self._clock() - self._keep_s
        for gone in [u for u, at in self._seen_at.items() if u not in live and at < old]:
            for kept in (self._pods, self._checked, self._seen_at):
                kept.pop(gone, None)
        return bound


def joined_message(claim: str, users: Users, share_uids: frozenset[int]) -> str:
    """What is wrong with pods that joined a claim already admitted, or "". Pure."""
    others = sorted(users.uids - share_uids)
    said = []
    if others:
        said.append(f"run as UID {', '.join(map(str, others))}")
    if users.unstated:
        said.append(f"state no user ({', '.join(users.unstated[:MAX_NAMED])})")
    if not said:
        return ""
    return (
        f"pods that joined claim {claim} {' and '.join(said)} while its shares here run as "
        f"UID {', '.join(map(str, sorted(share_uids)))}: one MPS server serves one user at a "
        "time, so their processes wait in CUDA initialisation until the share's other "
        "users have ended; run them as the share's user, or give them their own claim"
    )
