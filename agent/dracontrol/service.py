"""``gpushare dra controller``'s composition root: the API adapter, the agents (found by
their EndpointSlices, reached with the extender path's credentials), the controller,
leader election (:mod:`agent.kubeapi.leader`: only the holder of the Lease follows claims
and writes answers; a lost Lease stops that at once) and, with ``http_listen``, the probe
listener (:mod:`agent.dracontrol.probes`), up in every replica, standby or leader."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from agent.dracontrol.agents import AgentDecider, AgentsOptions, EndpointsApi, EndpointTargets
from agent.dracontrol.agents import connector as agent_connector
from agent.dracontrol.controller import BindingController
from agent.dracontrol.health import Progress
from agent.dracontrol.port import ClaimsApi
from agent.dracontrol.probes import ProbeServer
from agent.kubeapi.leader import LeaderElector, LeaderOptions
from agent.kubeapi.port import KubeApi


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    agents: AgentsOptions = field(default_factory=AgentsOptions)
    concurrency: int = 32  # API reads and status writes at once
    per_node_concurrency: int = 4  # asks at once to one node's agent
    page_size: int = 500  # claims per page of a list
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    watch_timeout_s: float = 300.0
    # the Lease held by the replica that works; None: this process works, unelected
    leader: LeaderOptions | None = None
    http_listen: str = ""  # host:port of /healthz, /readyz, /metrics; "": none
    stall_s: float = 900.0  # /healthz fails when the leader's follow loop is stuck this long


class ControllerApi(ClaimsApi, EndpointsApi, KubeApi, Protocol):
    """What the controller's process calls: claims, the agents' EndpointSlices, its Lease."""


async def run_controller(api: ControllerApi, options: ControllerOptions) -> None:
    """Serve until cancelled (or a failure, raised)."""
    decider = AgentDecider(EndpointTargets(api, options.agents), agent_connector(options.agents))
    controller = BindingController(
        api,
        decider,
        concurrency=options.concurrency,
        per_node_concurrency=options.per_node_concurrency,
        page_size=options.page_size,
        backoff_s=options.backoff_s,
        backoff_max_s=options.backoff_max_s,
        watch_timeout_s=options.watch_timeout_s,
        progress=Progress(stall_s=options.stall_s),
    )
    try:
        async with _probed(controller, decider, options.http_listen):
            if options.leader is None:
                await controller.run()
            else:
                await LeaderElector(api, options.leader).run(controller.run)
    finally:
        await decider.aclose()


@contextlib.asynccontextmanager
async def _probed(
    controller: BindingController, decider: AgentDecider, listen: str
) -> AsyncIterator[None]:
    """The probe listener up for the body (none without ``listen``)."""
    if not listen:
        yield
        return
    server = ProbeServer(controller, listen=listen, linked=lambda: len(decider.linked))
    await server.start()
    try:
        yield
    finally:
        await server.stop()
