"""``gpushare dra``: the cluster side of the DRA path. ``gpushare dra controller`` answers
the binding conditions of the claims allocated to driver gpushare.io, for the whole
cluster, by asking each node's agent (docs/kubernetes.md, "Binding answers")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

import click

from agent.cli.common import CONTEXT
from agent.cli.options import (
    API_TIMEOUT_HELP,
    agent_options,
    api_from,
    api_server_options,
    check_together,
    leader_from,
    leader_options,
    log_level_option,
    name_option,
    seconds_option,
    serve_until_stopped,
)
from agent.core.errors import GpushareError

log = logging.getLogger(__name__)

MIN_STALL_S = 600.0  # twice the watch's timeout: an idle watch says nothing until then


@click.group(context_settings=CONTEXT)
def dra() -> None:
    """The cluster side of the DRA path (see docs/kubernetes.md)."""


def _at_least_one(_ctx: click.Context, param: click.Parameter, value: int) -> int:
    if value < 1:
        raise click.BadParameter(f"{value} must be 1 or more", param=param)
    return value


def _listen_address(_ctx: click.Context, param: click.Parameter, value: str) -> str:
    _host, colon, port = value.rpartition(":")
    if value and (not colon or not port.isdigit() or int(port) > 65535):
        raise click.BadParameter(f"{value!r} is not HOST:PORT", param=param)
    return value


def _stall(_ctx: click.Context, param: click.Parameter, value: float) -> float:
    if value < MIN_STALL_S:
        raise click.BadParameter(f"{value:g} must be {MIN_STALL_S:g} or more", param=param)
    return value


@dra.command("controller", context_settings=CONTEXT)
@api_server_options()
@seconds_option("--api-timeout-s", 30.0, API_TIMEOUT_HELP)
@name_option("--agents-namespace", "gpushare-system", "Namespace of the agents' headless Service.")
@name_option(
    "--agents-service",
    "gpushare-agent",
    "The agents' headless Service; its EndpointSlices name one agent per node.",
)
@name_option(
    "--agents-port-name", "grpc", "The name of the agents' gRPC port in those EndpointSlices."
)
@agent_options(
    "Bearer token towards the agents (read again when it changes), over TLS, or plaintext "
    "with --insecure-agents."
)
@seconds_option("--discovery-interval-s", 10.0, "How often the agents' EndpointSlices are read.")
@seconds_option("--agent-timeout-s", 10.0, "How long one AnswerClaim call to an agent may take.")
@click.option(
    "--concurrency",
    type=int,
    default=32,
    show_default=True,
    callback=_at_least_one,
    help="API calls at once for the claims' answers (a claim read again, a status write).",
)
@click.option(
    "--per-node-concurrency",
    type=int,
    default=4,
    show_default=True,
    callback=_at_least_one,
    help="AnswerClaim calls at once to one node's agent (a slow agent holds only these).",
)
@click.option(
    "--list-page-size",
    type=int,
    default=500,
    show_default=True,
    callback=_at_least_one,
    help="Claims per page when the claims are listed (limit and continue).",
)
@seconds_option(
    "--backoff-max-s",
    30.0,
    "The longest wait between two tries of an answer not written, or of a list or watch "
    "of the claims that failed (from 1 s, doubling).",
)
@leader_options(
    elect_help="Work only in the replica that holds a coordination.k8s.io Lease (the others "
    "wait to take over).",
    namespace_help="Namespace of the leader election's Lease (the controller's own).",
    lease="gpushare-dra-controller",
    identity=True,
)
@click.option(
    "--http-listen",
    default="",
    metavar="HOST:PORT",
    callback=_listen_address,
    help="Serve /healthz, /readyz and /metrics here (0.0.0.0:9808 in a pod); '' none.",
)
@click.option(
    "--stall-s",
    type=float,
    default=900.0,
    show_default=True,
    callback=_stall,
    help="/healthz fails once the leader's list and watch of the claims made no progress "
    "for this long (at least 600: an idle watch may be silent for its 300 s).",
)
@log_level_option()
def dra_controller(**options: Any) -> None:
    """Answer the binding conditions of ResourceClaims allocated to driver gpushare.io:
    follow the claims once for the cluster, ask the agent of the node each waiting share is
    on (AnswerClaim: it admits or refuses with its own rules), and write its word into the
    claim's status.devices, until SIGTERM or SIGINT.

    An agent that cannot be reached leaves the answer owed (tried again); the scheduler's
    binding timeout deallocates a claim never answered.

    With --http-listen: /healthz fails while this replica leads and its list and watch of
    the claims are stuck (--stall-s); /readyz is ready in a standby replica, and in the
    leader once it has listed the claims and while its list and watch work.

    Exits 2 on a bad option or when neither --api-server nor an in-cluster service account
    is there, 1 when it fails at run time.
    """
    from agent.cli.logs import setup_logging
    from agent.dracontrol.agents import AgentsOptions
    from agent.dracontrol.service import ControllerOptions

    setup_logging(level=options["log_level"], fmt="text")
    check_together(options, agent_auth=True)
    controller = ControllerOptions(
        agents=AgentsOptions(
            namespace=options["agents_namespace"],
            service=options["agents_service"],
            port_name=options["agents_port_name"],
            ca_file=options["agent_ca"],
            cert_file=options["agent_cert"],
            key_file=options["agent_key"],
            token_file=options["agent_token_file"],
            server_name=options["agent_server_name"],
            insecure=options["insecure_agents"],
            discovery_interval_s=options["discovery_interval_s"],
            call_timeout_s=options["agent_timeout_s"],
        ),
        concurrency=options["concurrency"],
        per_node_concurrency=options["per_node_concurrency"],
        page_size=options["list_page_size"],
        backoff_max_s=max(options["backoff_max_s"], 1.0),
        leader=leader_from(options),
        http_listen=options["http_listen"],
        stall_s=options["stall_s"],
    )
    serve_until_stopped(_serve(options, controller))


async def _serve(options: dict[str, Any], controller: Any) -> None:
    from agent.dracontrol.service import run_controller

    api = api_from(options)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    try:
        working = asyncio.ensure_future(run_controller(api, controller))
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({working, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if working.done():
            working.result()  # it failed: raise it
            raise GpushareError("the controller ended")
        log.info("stopping")
        working.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await working
    finally:
        await api.aclose()
