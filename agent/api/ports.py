"""What the API needs from the node, as ports the runtime implements."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.core.errors import ConflictError
from agent.core.learning import ProgressAnswer, RetrainAnswer
from agent.core.lease import Lease
from agent.core.snapshot import NodeSnapshot
from agent.core.types import AdmissionRequest, AdmitResult, BatchResult, Device, Event


class NodeApi(Protocol):
    def snapshot(self, *, ledger_only: bool = False) -> NodeSnapshot: ...

    def device_index(self, device_uuid: str) -> int: ...

    def device(self, device_uuid: str) -> Device | None: ...

    async def admit(
        self, request: AdmissionRequest, *, gang_id: str | None = None, ttl_s: float | None = None
    ) -> AdmitResult: ...

    async def admit_batch(self, requests: Sequence[AdmissionRequest]) -> BatchResult: ...

    async def explain(self, request: AdmissionRequest) -> AdmitResult: ...

    async def commit(self, gang_id: str, *, owner: str | None = None) -> list[Lease]: ...

    async def abort(self, gang_id: str, *, owner: str | None = None) -> list[Lease]: ...

    async def release(self, lease_id: str, *, owner: str | None = None) -> Lease: ...

    def owner_of(self, lease_id: str) -> str:
        """The caller identity that made a live or recently ended lease, else ""."""
        ...

    async def drain(self, device_uuid: str | None, reason: str) -> list[str]: ...

    async def undrain(self, device_uuid: str | None) -> list[str]: ...

    async def clear_stale(self, *, dry_run: bool) -> list[str]: ...

    async def report_progress(
        self, lease_id: str, units_done: float, *, owner: str | None = None
    ) -> ProgressAnswer:
        """A workload's cumulative progress on a live lease (``owner``: None, any lease)."""
        ...

    async def retrain_estimator(self) -> RetrainAnswer:
        """Retrain the retention model on the node's run records now (one at a time)."""
        ...


class EventFeed(Protocol):
    """Numbered events: the recent ones in memory (dense numbers), older ones from the
    store's reader."""

    def since(self, seq: int = 0, *, limit: int | None = None) -> list[Event]: ...

    @property
    def oldest_seq(self) -> int: ...

    @property
    def last_seq(self) -> int: ...

    def change(self) -> asyncio.Event:
        """Set by the next published batch; take it before reading ``since``."""
        ...

    async def stored_since(self, seq: int, *, limit: int) -> list[Event]: ...

    async def first_stored_seq(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ShareAnswer:
    """The agent's binding answer on one share of a claim allocated to this node."""

    device: str  # the published device name
    share_id: str  # "" for a result without one
    admitted: bool  # gpushare.io/admitted; False: gpushare.io/refused
    reason: str  # "Admitted", "AdminAccess", or the refusal's reason code (else "Refused")
    message: str  # a sentence: the lease and its limits, or why it was refused


class ClaimAnswers(Protocol):
    """The DRA driver's binding decision, asked by the cluster's binding controller."""

    async def answer_claim(self, claim: Mapping[str, Any]) -> list[ShareAnswer]:
        """The answers on the claim's shares here that wait for their binding condition
        ([] when none does). A claim that cannot be read: ValidationError; the DRA driver
        off: ConflictError; not started yet: GpushareError."""
        ...


class NoClaimAnswers:
    """Where no DRA driver serves (a test's service, a node without DRA)."""

    async def answer_claim(self, claim: Mapping[str, Any]) -> list[ShareAnswer]:
        raise ConflictError("the DRA driver is off on this node (dra.enabled)")
