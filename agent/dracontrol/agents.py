"""The real :class:`~agent.dracontrol.port.Decider`: the agent of a node, found as the
extender path finds it (the agents' headless Service's EndpointSlices, port ``grpc``:
:mod:`agent.kubeapi.endpoints`), asked over gRPC with the same credentials (mutual TLS
with the agents' CA, and the bearer token of the agents' Secret), ``AnswerClaim`` with the
claim as the API server has it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import grpc
import grpc.aio

from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient
from agent.client.credentials import AgentSecrets, agent_token
from agent.core.errors import ConfigError
from agent.dracontrol.port import ShareAnswerValue, Unreached
from agent.kubeapi.endpoints import GRPC_PORT_NAME, targets_from_slices
from agent.kubeapi.port import KubeError, Obj

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentsOptions:
    namespace: str = "gpushare-system"  # the agents' headless Service
    service: str = "gpushare-agent"
    port_name: str = GRPC_PORT_NAME
    ca_file: str = ""  # TLS towards the agents: their CA
    cert_file: str = ""  # mutual TLS: this side's certificate and key
    key_file: str = ""
    token_file: str = ""  # a bearer token (over TLS, or plaintext with ``insecure``)
    # the name the agents' certificates carry: they are reached by pod address
    server_name: str = "gpushare-agent.gpushare-system.svc"
    insecure: bool = False  # plaintext to the agents (tests and kind only)
    discovery_interval_s: float = 10.0  # the EndpointSlices read again at most this often
    call_timeout_s: float = 10.0


class AnswerLink(Protocol):
    """One agent, as :class:`agent.client.AgentClient` offers it."""

    async def answer_claim(self, claim: Mapping[str, Any]) -> pb.AnswerClaimResponse: ...


Connect = Callable[[str], AbstractAsyncContextManager[AnswerLink]]


class EndpointsApi(Protocol):
    async def list_endpoint_slices(self, namespace: str, service: str) -> list[Obj]: ...


class Targets(Protocol):
    async def target(self, node: str) -> str:
        """``host:port`` (or ``unix://PATH``) of the node's agent; raises Unreached."""
        ...


@dataclass(frozen=True, slots=True)
class KnownNodes:
    """The nodes that have an agent, as last read; ``version`` changes when they do."""

    version: int
    nodes: frozenset[str]


@runtime_checkable
class KnowsNodes(Protocol):
    """Targets that can say which nodes they know (:class:`EndpointTargets`): the decider
    closes the channels of nodes no longer among them. Others (a fixed map) keep their
    channels until :meth:`AgentDecider.aclose`."""

    def known(self) -> KnownNodes: ...


class EndpointTargets:
    """Node -> its agent's address, from the agents' EndpointSlices: read again when the
    last read is ``interval_s`` old, or at once (at most once a second) for a node that
    has none, e.g. an agent that just became ready."""

    MISS_S = 1.0

    def __init__(
        self,
        api: EndpointsApi,
        options: AgentsOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._options = options
        self._clock = clock
        self._known: dict[str, str] = {}
        self._nodes = KnownNodes(0, frozenset())
        self._read_at: float | None = None
        self._lock = asyncio.Lock()
        self.reads = 0

    async def target(self, node: str) -> str:
        async with self._lock:  # asks at once share one read
            age_s = None if self._read_at is None else self._clock() - self._read_at
            if (
                age_s is None
                or age_s >= self._options.discovery_interval_s
                or (node not in self._known and age_s >= self.MISS_S)
            ):
                await self._read()
        if node not in self._known:
            options = self._options
            raise Unreached(
                f"no ready agent on node {node} among the EndpointSlices of "
                f"{options.namespace}/{options.service} (port {options.port_name!r})"
            )
        return self._known[node]

    def known(self) -> KnownNodes:
        return self._nodes

    async def _read(self) -> None:
        options = self._options
        try:
            slices = await self._api.list_endpoint_slices(options.namespace, options.service)
        except KubeError as exc:  # the last ones known stay in use
            log.warning("cannot list the agents' endpoints: %s", exc)
            if self._read_at is None:
                raise Unreached(f"the agents' endpoints are not known: {exc}") from exc
            return
        finally:
            self._read_at = self._clock()
        self.reads += 1
        found = targets_from_slices(slices, port_name=options.port_name)
        if found.keys() != self._known.keys():
            self._nodes = KnownNodes(self._nodes.version + 1, frozenset(found))
        self._known = found


def connector(options: AgentsOptions) -> Connect:
    """target -> an AgentClient for ``async with``; the token file read again when it
    changes, the TLS files at each new connection (the last good ones kept)."""
    token = agent_token(options.token_file)
    try:  # at start, unreadable files are an error
        secrets = AgentSecrets(
            options.ca_file,
            cert_file=options.cert_file,
            key_file=options.key_file,
            insecure=options.insecure,
        )
    except (OSError, ValueError) as exc:
        raise ConfigError("--agent-ca", str(exc)) from exc

    def connect(target: str) -> AbstractAsyncContextManager[AnswerLink]:
        return AgentClient(
            target,
            token=token,
            credentials=secrets.current(),
            server_name=options.server_name if not options.insecure else "",
            timeout_s=options.call_timeout_s,
            attempts=2,
        )

    return connect


class AgentDecider:
    """Asks the node's agent; one open channel per node, kept between asks, closed when
    the node's agent has another address, when the node is no longer among the agents'
    endpoints (with targets that say so: :class:`KnowsNodes`), or at :meth:`aclose`."""

    def __init__(self, targets: Targets, connect: Connect) -> None:
        self._targets = targets
        self._connect = connect
        # node -> (its agent's address, the link to it, what closes it)
        self._links: dict[str, tuple[str, AnswerLink, contextlib.AsyncExitStack]] = {}
        self._pruned_at = 0  # the KnownNodes version the links were last pruned at

    @property
    def linked(self) -> frozenset[str]:
        """The nodes whose agent has an open channel now."""
        return frozenset(self._links)

    async def answer(self, node: str, claim: Obj) -> list[ShareAnswerValue]:
        try:
            target = await self._targets.target(node)
        finally:  # the read may have found nodes gone (this one too)
            await self._prune()
        try:
            link = await self._link(node, target)
            reply = await link.answer_claim(claim)
        except grpc.aio.AioRpcError as exc:
            raise Unreached(
                f"the agent of {node} ({target}): {exc.code().name}: {exc.details()}"
            ) from exc
        except (OSError, ValueError) as exc:
            raise Unreached(f"the agent of {node} ({target}): {exc}") from exc
        return [
            ShareAnswerValue(a.device, a.share_id, a.admitted, a.reason, a.message)
            for a in reply.answers
        ]

    async def _link(self, node: str, target: str) -> AnswerLink:
        held = self._links.get(node)
        if held is not None and held[0] == target:
            return held[1]
        if held is not None:  # the node's agent moved (a new pod): the old channel closed
            del self._links[node]
            await _closed(held[2])
        stack = contextlib.AsyncExitStack()
        link = await stack.enter_async_context(self._connect(target))
        raced = self._links.pop(node, None)  # another ask opened one meanwhile
        if raced is not None and raced[0] == target:
            self._links[node] = raced
            await _closed(stack)
            return raced[1]
        self._links[node] = (target, link, stack)
        if raced is not None:
            await _closed(raced[2])
        return link

    async def _prune(self) -> None:
        """Close the channels of the nodes no longer known, once per change of them."""
        if not isinstance(self._targets, KnowsNodes):
            return
        known = self._targets.known()
        if known.version == self._pruned_at:
            return
        self._pruned_at = known.version
        for node in [n for n in self._links if n not in known.nodes]:
            if (held := self._links.pop(node, None)) is not None:
                log.info("the agent of %s is no longer among the agents' endpoints", node)
                await _closed(held[2])

    async def aclose(self) -> None:
        links, self._links = self._links, {}
        for _, _, stack in links.values():
            await _closed(stack)


async def _closed(stack: contextlib.AsyncExitStack) -> None:
    try:
        await stack.aclose()
    except Exception as exc:  # a channel that fails to close is gone all the same
        log.debug("closing a channel to an agent: %r", exc)
