"""Claims as leases: each share the scheduler allocated to this node becomes a lease of the
node's ledger, admitted through the same path as ``Admit`` (same rules, same durable
store), pinned to the device the scheduler chose, under a request id made from the
claim's UID and the share: asked again (a retried Prepare, the binding condition then
Prepare) it answers the same lease. A claim prepared again after its lease ended (a claim
that outlived its pod and serves a new one) takes a new id of the same share.

What a share may consume is the scheduler's: the claim's ``consumedCapacity``; the
driver's last line of defense is the ledger, which refuses what would overfill a device
whatever the scheduler thought."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from agent.api import validate
from agent.core.errors import (
    AlreadyExistsError,
    ConflictError,
    GpushareError,
    PermissionDeniedError,
    ValidationError,
)
from agent.core.lease import CLAIM_OWNER, CLAIM_REQUEST_PREFIX, ENDED_REQUEST_ID_HINT, Lease
from agent.core.types import AdmissionRequest, AdmitResult, Decision, PriorityClass
from agent.dra.claims import ClaimError, Share, ShareConfig, metadata, reserved_pods
from agent.node.service import NodeService

log = logging.getLogger(__name__)

REQUEST_PREFIX = CLAIM_REQUEST_PREFIX
OWNER = CLAIM_OWNER


def share_request_id(claim_uid: str, share: Share, epoch: int = 0) -> str:
    base = f"{REQUEST_PREFIX}{claim_uid}:{share.key}"
    return base if epoch == 0 else f"{base}:{epoch}"


def claim_uid_of(request_id: str) -> str | None:
    """The claim UID a DRA request id was made from; None for any other request id."""
    if not request_id.startswith(REQUEST_PREFIX):
        return None
    return request_id[len(REQUEST_PREFIX) :].partition(":")[0]


def share_of(request_id: str) -> str:
    """The share key of a DRA request id (``dra:<claim uid>:<share>[:<epoch>]``; neither
    a share id nor a ``<request>-<device>`` key holds a colon)."""
    parts = request_id.split(":")
    return parts[2] if len(parts) > 2 else ""


@dataclass(frozen=True, slots=True)
class ShareAsk:
    """Everything a share's admission is made of."""

    claim: Mapping[str, object]
    share: Share
    device_uuid: str
    config: ShareConfig
    run_as_uid: int | None = None  # the UID of the claim's pods (agent.claims.users)


def owner_pod(claim: Mapping[str, object]) -> tuple[str, str] | None:
    """(name, uid) of the pod a claim was made for (from its template): its one user."""
    owners = metadata(claim).get("ownerReferences") or []
    for owner in owners if isinstance(owners, list) else []:
        if isinstance(owner, Mapping) and owner.get("kind") == "Pod":
            return str(owner.get("name") or ""), str(owner.get("uid") or "")
    return None


def admission_request(
    ask: ShareAsk, *, default_memory_bytes: int, default_thread_pct: float, epoch: int
) -> AdmissionRequest:
    """The share's request. A claim made for one pod binds its lease to that pod's
    processes (``workload``); a shared claim's lease takes any pod's that uses it."""
    meta = metadata(ask.claim)
    namespace, uid = str(meta.get("namespace") or ""), str(meta.get("uid") or "")
    owner = owner_pod(ask.claim)
    pods = [owner] if owner else reserved_pods(ask.claim)
    share = ask.share
    workload = f"pod:{owner[1]}" if owner and owner[1] else ""
    pod = f"{namespace}/{pods[0][0]}" if pods and pods[0][0] else ""
    try:  # from the API, as Admit takes them from a caller
        validate.workload(workload, "the claim's owner pod UID")
        validate.pod(pod, "the claim's pod")
        validate.identifier(namespace, "the claim's namespace")
    except ValidationError as exc:
        raise ClaimError(str(exc)) from exc
    return AdmissionRequest(
        request_id=share_request_id(uid, share, epoch),
        tenant=namespace,
        trust_domain=namespace,
        priority=PriorityClass(ask.config.priority),
        memory_bytes=share.memory_bytes if share.memory_bytes is not None else default_memory_bytes,
        thread_pct=share.thread_pct if share.thread_pct is not None else default_thread_pct,
        profile=ask.config.profile,
        retention_floor=ask.config.retention_floor,
        device_uuid=ask.device_uuid,
        workload=workload,
        pod=pod,
        owner=OWNER,
        run_as_uid=ask.run_as_uid,
    )


def one_share_per_request(mine: Sequence[Share]) -> None:
    """A request gets one share on a node: each request serves one container (a pod of
    several containers has a request each, so several shares), and a process talks to one
    MPS server, so one container on two GPUs cannot be served by MPS as it runs today."""
    devices_of: dict[str, list[str]] = {}
    for share in mine:
        devices_of.setdefault(share.request, []).append(share.device)
    for request, devices in sorted(devices_of.items()):
        if len(devices) > 1:
            raise ClaimError(
                f"ONE_SHARE_PER_REQUEST: request {request!r} holds {len(devices)} shares on "
                f"this node ({', '.join(devices)}); a process reaches one MPS server, so a "
                "container is served on one GPU (ask for one device per request)"
            )


def claim_leases(leases: Iterable[Lease], claim_uid: str) -> Iterator[Lease]:
    """The claim's live shares: the driver's leases (``owner``) of its request ids."""
    prefix = f"{REQUEST_PREFIX}{claim_uid}:"
    return (x for x in leases if x.held_by_claim and x.request_id.startswith(prefix))


class ShareLeases:
    """Admits and releases the leases of claims' shares; one claim at a time."""

    def __init__(
        self, node: NodeService, *, default_memory_bytes: int, default_thread_pct: float
    ) -> None:
        self._node = node
        self._default_memory_bytes = default_memory_bytes
        self._default_thread_pct = default_thread_pct
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @asynccontextmanager
    async def claim_lock(self, claim_uid: str) -> AsyncIterator[None]:
        """One Prepare, Unprepare, binding answer or reconcile of a claim at a time."""
        lock = self._locks.setdefault(claim_uid, asyncio.Lock())
        self._users[claim_uid] = self._users.get(claim_uid, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[claim_uid] -= 1
            if not self._users[claim_uid]:
                del self._users[claim_uid], self._locks[claim_uid]

    def live(self, claim_uid: str, share: Share) -> Lease | None:
        """The share's live lease, if it has one."""
        for lease in claim_leases(self._node.leases.values(), claim_uid):
            if share_of(lease.request_id) == share.key:
                return lease
        return None

    async def admit(self, ask: ShareAsk) -> AdmitResult:
        """The share's lease: its live one as it is (whoever the claim is reserved for
        now), or a new admission under the share's first request id no ended lease used.
        Call under the claim's lock."""
        uid = str(metadata(ask.claim).get("uid") or "")
        held = self.live(uid, ask.share)
        if held is not None:
            decision = Decision(True, held.device_uuid, message="already admitted (its share)")
            return self._node.admissions.result(decision, held)
        try:
            return await self._admit_as(ask, 0)
        except AlreadyExistsError:
            pass  # an ended lease of this share, asked for otherwise then
        except ConflictError as exc:
            if ENDED_REQUEST_ID_HINT not in str(exc):
                raise ClaimError(str(exc)) from exc
        # The share's first id belongs to a lease that ended (the claim outlived its pod
        # and serves another here): a new id, unique, as no live lease holds the share.
        return await self._admit_as(ask, time.time_ns())

    async def _admit_as(self, ask: ShareAsk, epoch: int) -> AdmitResult:
        request = admission_request(
            ask,
            default_memory_bytes=self._default_memory_bytes,
            default_thread_pct=self._default_thread_pct,
            epoch=epoch,
        )
        try:
            return await self._node.admit(request)
        except PermissionDeniedError as exc:  # made by another caller: not ours
            raise ClaimError(str(exc)) from exc

    async def release(self, lease_ids: Iterable[str], claim_uid: str, why: str) -> list[str]:
        """Release these leases of the claim that are still live; the ids released."""
        released = []
        for lease_id in lease_ids:
            if lease_id not in self._node.leases:
                continue
            try:
                await self._node.release(lease_id)
            except GpushareError as exc:
                if lease_id in self._node.leases:
                    raise
                log.debug("lease %s ended meanwhile: %s", lease_id, exc)
                continue
            released.append(lease_id)
            log.info("released lease %s of claim %s (%s)", lease_id, claim_uid, why)
        return released

    async def release_claim(self, claim_uid: str, why: str) -> list[str]:
        """Release every live lease of the claim; the ids released."""
        held = [x.lease_id for x in claim_leases(self._node.leases.values(), claim_uid)]
        return await self.release(held, claim_uid, why)
