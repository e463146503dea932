"""``gpushare dra controller``'s composition root: the API adapter, the agents (found by
their EndpointSlices, reached with the extender path's credentials), the controller, and
leader election (:mod:`agent.kubeapi.leader`): only the holder of the Lease follows claims
and writes answers; a lost Lease stops that at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agent.dracontrol.agents import AgentDecider, AgentsOptions, EndpointsApi, EndpointTargets
from agent.dracontrol.agents import connector as agent_connector
from agent.dracontrol.controller import BindingController
from agent.dracontrol.port import ClaimsApi
from agent.kubeapi.leader import LeaderElector, LeaderOptions
from agent.kubeapi.port import KubeApi


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    agents: AgentsOptions = field(default_factory=AgentsOptions)
    concurrency: int = 32  # claims tried at once (an ask and a status write each)
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    watch_timeout_s: float = 300.0
    # the Lease held by the replica that works; None: this process works, unelected
    leader: LeaderOptions | None = None


class ControllerApi(ClaimsApi, EndpointsApi, KubeApi, Protocol):
    """What the controller's process calls: claims, the agents' EndpointSlices, its Lease."""


async def run_controller(api: ControllerApi, options: ControllerOptions) -> None:
    """Serve until cancelled (or a failure, raised)."""
    decider = AgentDecider(EndpointTargets(api, options.agents), agent_connector(options.agents))
    controller = BindingController(
        api,
        decider,
        concurrency=options.concurrency,
        backoff_s=options.backoff_s,
        backoff_max_s=options.backoff_max_s,
        watch_timeout_s=options.watch_timeout_s,
    )
    try:
        if options.leader is None:
            await controller.run()
        else:
            await LeaderElector(api, options.leader).run(controller.run)
    finally:
        await decider.aclose()
