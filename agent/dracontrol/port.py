"""What the controller needs of the agents: a :class:`Decider` that asks a node's agent
about a claim and returns its word on each share waiting there. The real one
(:class:`agent.dracontrol.agents.AgentDecider`) calls the agent's ``AnswerClaim`` over gRPC;
tests give their own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from agent.core.errors import GpushareError
from agent.kubeapi.port import Listing, Obj, WatchEvent


@dataclass(frozen=True, slots=True)
class ShareAnswerValue:
    """The agent's word on one share of a claim on its node."""

    device: str
    share_id: str  # "" for a result without one
    admitted: bool  # True: gpushare.io/admitted; False: gpushare.io/refused
    reason: str  # the condition's reason ("Admitted", "AdminAccess", a refusal code)
    message: str


class Unreached(GpushareError):
    """The node's agent gave no answer (not found among the agents' endpoints, not reached,
    timed out, or it failed): the answer stays owed; the controller never refuses a share
    on its own."""


class Decider(Protocol):
    async def answer(self, node: str, claim: Obj) -> list[ShareAnswerValue]:
        """The agent of ``node``'s answers for its shares of ``claim`` that wait (empty
        when none waits there); asked again, the same. Raises :class:`Unreached`."""
        ...


class ClaimsApi(Protocol):
    """The part of :class:`agent.kubeapi.port.ResourceApi` the controller calls (and its
    RBAC grants: resourceclaims get, list, watch; resourceclaims/status update)."""

    async def get_resource_claim(self, namespace: str, name: str) -> Obj: ...

    async def list_resource_claims(self, *, limit: int = 0, continue_token: str = "") -> Listing:
        """One page (``limit`` > 0) of the claims of every namespace, from the page whose
        listing gave ``continue_token``; raises Gone when that token expired."""
        ...

    def watch_resource_claims(
        self, resource_version: str, *, timeout_s: float = 300.0, mentioning: str = ""
    ) -> AsyncIterator[WatchEvent]: ...

    async def replace_resource_claim_status(self, namespace: str, name: str, body: Obj) -> Obj: ...
