"""``gpushare dra``: the cluster side of the DRA path. ``gpushare dra controller`` answers
the binding conditions of the claims allocated to driver gpushare.io, for the whole
cluster, by asking each node's agent (docs/kubernetes.md, "Binding answers")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

import click

from agent.cli import exits
from agent.cli.common import CONTEXT, fail
from agent.cli.kube import _api, file_option, seconds_option
from agent.core.errors import ConfigError, GpushareError

log = logging.getLogger(__name__)


@click.group(context_settings=CONTEXT)
def dra() -> None:
    """The cluster side of the DRA path (see docs/kubernetes.md)."""


def _at_least_one(_ctx: click.Context, param: click.Parameter, value: int) -> int:
    if value < 1:
        raise click.BadParameter(f"{value} must be 1 or more", param=param)
    return value


@dra.command("controller", context_settings=CONTEXT)
@click.option(
    "--api-server",
    envvar="GPUSHARE_KUBE_API_SERVER",
    metavar="URL",
    default="",
    help="The Kubernetes API server (https://HOST:6443). Default: the pod's service account "
    "(in-cluster). Env: GPUSHARE_KUBE_API_SERVER.",
)
@file_option("--api-token-file", "Bearer token for --api-server.")
@file_option("--api-ca", "CA of --api-server's certificate.")
@seconds_option(
    "--api-timeout-s",
    30.0,
    "How long one request to the API server may take before its answer is given up "
    "(a watch: how long it may stay silent past its own timeout).",
)
@click.option(
    "--agents-namespace",
    default="gpushare-system",
    show_default=True,
    help="Namespace of the agents' headless Service.",
)
@click.option(
    "--agents-service",
    default="gpushare-agent",
    show_default=True,
    help="The agents' headless Service; its EndpointSlices name one agent per node.",
)
@click.option(
    "--agents-port-name",
    default="grpc",
    show_default=True,
    help="The name of the agents' gRPC port in those EndpointSlices.",
)
@file_option("--agent-ca", "CA of the agents' certificates (TLS towards the agents).")
@file_option("--agent-cert", "This side's certificate, for mutual TLS with the agents.")
@file_option("--agent-key", "The key of --agent-cert.")
@file_option(
    "--agent-token-file",
    "Bearer token towards the agents (read again when it changes), over TLS, or plaintext "
    "with --insecure-agents.",
)
@click.option(
    "--agent-server-name",
    default="gpushare-agent.gpushare-system.svc",
    show_default=True,
    help="The name the agents' certificates carry (they are reached by pod address).",
)
@click.option(
    "--insecure-agents",
    is_flag=True,
    help="Plaintext gRPC to the agents: for tests and kind clusters only.",
)
@seconds_option("--discovery-interval-s", 10.0, "How often the agents' EndpointSlices are read.")
@seconds_option("--agent-timeout-s", 10.0, "How long one AnswerClaim call to an agent may take.")
@click.option(
    "--concurrency",
    type=int,
    default=32,
    show_default=True,
    callback=_at_least_one,
    help="Claims answered at once (one agent call and one status write each).",
)
@seconds_option(
    "--backoff-max-s",
    30.0,
    "The longest wait between two tries of an answer not written (from 1 s, doubling).",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=True,
    show_default=True,
    help="Work only in the replica that holds a coordination.k8s.io Lease (the others wait "
    "to take over).",
)
@click.option(
    "--leader-elect-namespace",
    default="gpushare-system",
    show_default=True,
    help="Namespace of the leader election's Lease (the controller's own).",
)
@click.option(
    "--leader-elect-lease",
    default="gpushare-dra-controller",
    show_default=True,
    help="Name of the leader election's Lease.",
)
@click.option(
    "--leader-elect-identity",
    default="",
    help="This replica's name in the Lease. Default: the pod's name and a random suffix.",
)
@seconds_option(
    "--leader-elect-lease-duration-s",
    15.0,
    "How long the other replicas wait, after the leader's last renewal they saw, to take over.",
)
@seconds_option(
    "--leader-elect-renew-deadline-s",
    10.0,
    "How long the leader goes on without a renewal before it stops (below the duration).",
)
@seconds_option(
    "--leader-elect-retry-period-s",
    2.0,
    "Between two reads of the Lease, by the leader and the candidates.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def dra_controller(**options: Any) -> None:
    """Answer the binding conditions of ResourceClaims allocated to driver gpushare.io:
    follow the claims once for the cluster, ask the agent of the node each waiting share is
    on (AnswerClaim: it admits or refuses with its own rules), and write its word into the
    claim's status.devices, until SIGTERM or SIGINT.

    An agent that cannot be reached leaves the answer owed (tried again); the scheduler's
    binding timeout deallocates a claim never answered.

    Exits 2 on a bad option or when neither --api-server nor an in-cluster service account
    is there, 1 when it fails at run time.
    """
    from agent.dracontrol.agents import AgentsOptions
    from agent.dracontrol.service import ControllerOptions
    from agent.runtime.logs import setup_logging

    setup_logging(level=options["log_level"], fmt="text")
    _check(options)
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
        backoff_max_s=max(options["backoff_max_s"], 1.0),
        leader=_leader(options),
    )
    try:
        asyncio.run(_serve(options, controller))
    except ConfigError as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    except GpushareError as exc:
        fail(str(exc), exits.FAILURE)
    sys.exit(exits.OK)


def _check(options: dict[str, Any]) -> None:
    """Options that only make sense together, named at once."""
    problems = []
    if bool(options["agent_cert"]) != bool(options["agent_key"]):
        problems.append("--agent-cert and --agent-key go together")
    if not options["insecure_agents"] and not options["agent_ca"]:
        problems.append("--agent-ca is needed (TLS towards the agents), or --insecure-agents")
    if not options["agent_cert"] and not options["agent_token_file"]:
        problems.append("the agents need --agent-cert/--agent-key or --agent-token-file (or both)")
    if (options["api_token_file"] or options["api_ca"]) and not options["api_server"]:
        problems.append("--api-token-file and --api-ca go with --api-server")
    if problems:
        fail("usage: " + "; ".join(problems), exits.CONFIG)


def _leader(options: dict[str, Any]) -> Any:
    from agent.kubeapi.leader import LeaderOptions

    if not options["leader_elect"]:
        return None
    try:
        return LeaderOptions(
            namespace=options["leader_elect_namespace"],
            name=options["leader_elect_lease"],
            identity=options["leader_elect_identity"],
            lease_duration_s=options["leader_elect_lease_duration_s"],
            renew_deadline_s=options["leader_elect_renew_deadline_s"],
            retry_period_s=options["leader_elect_retry_period_s"],
        )
    except ValueError as exc:
        fail(f"usage: {exc}", exits.CONFIG)


async def _serve(options: dict[str, Any], controller: Any) -> None:
    from agent.dracontrol.service import run_controller

    api = _api(options)
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
