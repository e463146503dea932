"""Claims as leases: each share the scheduler allocated to this node becomes a lease of the
node's ledger, admitted through the same path as ``Admit`` (same rules, same durable
store), pinned to the device the scheduler chose, under a request id made from the
claim's UID and the share: asked again (a retried Prepare, the binding condition then
Prepare) it answers the same lease. A claim prepared again after its lease ended (a claim
that outlived its pod and serves a new one) takes the next id of the same share.

What a share may consume is the scheduler's: the claim's ``consumedCapacity``; the
driver's last line of defense is the ledger, which refuses what would overfill a device
whatever the scheduler thought."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from agent.core.errors import ConflictError, GpushareError
from agent.core.lease import ENDED_REQUEST_ID_HINT, Lease
from agent.core.types import AdmissionRequest, AdmitResult, PriorityClass
from agent.dra.claims import ClaimError, Share, ShareConfig, metadata, reserved_pods
from agent.runtime.node import NodeService

log = logging.getLogger(__name__)

REQUEST_PREFIX = "dra:"
OWNER = "dra"
MAX_EPOCHS = 64  # a claim re-prepared more often than this on one node is refused


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


def admission_request(
    ask: ShareAsk, *, default_memory_bytes: int, default_thread_pct: float, epoch: int
) -> AdmissionRequest:
    meta = metadata(ask.claim)
    namespace, uid = str(meta.get("namespace") or ""), str(meta.get("uid") or "")
    pods = reserved_pods(ask.claim)
    share = ask.share
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
        workload=f"pod:{pods[0][1]}" if pods and pods[0][1] else "",
        pod=f"{namespace}/{pods[0][0]}" if pods and pods[0][0] else "",
        owner=OWNER,
    )


def claim_leases(leases: Iterable[Lease], claim_uid: str) -> Iterator[Lease]:
    prefix = f"{REQUEST_PREFIX}{claim_uid}:"
    return (x for x in leases if x.request_id.startswith(prefix))


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
        """One Prepare, Unprepare or binding answer of a claim at a time."""
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
        """The share's lease: the live one, or a new admission under the share's first
        request id not used by an ended lease."""
        uid = str(metadata(ask.claim).get("uid") or "")
        for epoch in range(MAX_EPOCHS):
            request = admission_request(
                ask,
                default_memory_bytes=self._default_memory_bytes,
                default_thread_pct=self._default_thread_pct,
                epoch=epoch,
            )
            try:
                return await self._node.admit(request)
            except ConflictError as exc:
                if ENDED_REQUEST_ID_HINT not in str(exc):
                    raise ClaimError(str(exc)) from exc
        raise ClaimError(f"claim {uid} was prepared {MAX_EPOCHS} times on this node: refused")

    async def release_claim(self, claim_uid: str, why: str) -> list[str]:
        """Release every live lease of the claim; the ids released."""
        released = []
        for lease in list(claim_leases(self._node.leases.values(), claim_uid)):
            try:
                await self._node.release(lease.lease_id)
            except GpushareError as exc:
                if lease.lease_id in self._node.leases:
                    raise
                log.debug("lease %s ended meanwhile: %s", lease.lease_id, exc)
                continue
            released.append(lease.lease_id)
            log.info("released lease %s of claim %s (%s)", lease.lease_id, claim_uid, why)
        return released
