"""``gpushare kube serve``: the cluster side of the Kubernetes integration (the extender
beside a second kube-scheduler, the lease controller, the node-state publisher and, if
asked, the admission webhook), in the foreground until SIGTERM or SIGINT."""

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
from agent.cli.options import (
    API_PROBLEM,
    API_TIMEOUT_HELP,
    agent_options,
    api_from,
    api_problem,
    api_server_options,
    check_together,
    file_option,
    leader_from,
    leader_options,
    log_level_option,
    name_option,
    seconds_option,
    serve_until_stopped,
)
from agent.cli.rollout import kube_wait_rollout
from agent.core.errors import ConfigError, GpushareError

log = logging.getLogger(__name__)


@click.group(context_settings=CONTEXT)
def kube() -> None:
    """The cluster side of the Kubernetes integration (see docs/kubernetes.md)."""


kube.add_command(kube_wait_rollout)


def _listen(_ctx: click.Context, param: click.Parameter, value: str) -> str:
    """HOST:PORT with a port number, or empty."""
    if not value:
        return value
    _, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT", param=param)
    return value


@kube.command("serve", context_settings=CONTEXT)
@api_server_options()
@name_option("--agents-namespace", "gpushare-system", "Namespace of the agents' headless Service.")
@name_option(
    "--agents-service",
    "gpushare-agent",
    "The agents' headless Service; its EndpointSlices (port 'grpc') name one agent per node.",
)
@agent_options("Bearer token towards the agents (over TLS, or plaintext with --insecure-agents).")
@click.option(
    "--extender-listen",
    default="127.0.0.1:8888",
    show_default=True,
    callback=_listen,
    metavar="HOST:PORT",
    help="Where the extender listens (kube-scheduler calls it from the same pod).",
)
@click.option(
    "--webhook-listen",
    default="",
    callback=_listen,
    metavar="HOST:PORT",
    help="Serve the admission webhook (HTTPS) here, e.g. 0.0.0.0:8443. Default: no webhook.",
)
@file_option("--webhook-cert", "The webhook's TLS certificate.")
@file_option("--webhook-key", "The webhook's TLS key.")
@click.option(
    "--run-as-user",
    type=click.Choice(["required", "optional"]),
    default="required",
    show_default=True,
    help="Whether a share pod must state the one UID its share runs as "
    "(securityContext.runAsUser of the pod, or of each container that asks "
    "gpushare.io/share): an MPS control daemon runs one server per UID at a time. "
    "required: the webhook, the extender's filter and its bind refuse a pod whose share's "
    "containers do not all state the same UID, and the filter keeps one UID per device. "
    "optional: for nodes whose MPS daemons run multi-user (mps.multi_user): such pods pass; "
    "a UID stated is still sent to the agents, which judge the one-user rule themselves.",
)
@seconds_option(
    "--reconcile-interval-s",
    60.0,
    "How often every agent's pod leases are checked against the pods.",
)
@seconds_option(
    "--lease-grace-s",
    60.0,
    "A pod lease younger than this is left to the bind that may be making "
    "it; the reconcile judges older ones.",
)
@seconds_option(
    "--hold-s",
    30.0,
    "How long a bind waits for the kubelet to allocate the previous pod bound to the same node.",
)
@seconds_option(
    "--gang-ttl-s",
    120.0,
    "How long a gang's members may take to all be reserved before it is aborted.",
)
@seconds_option(
    "--bind-resolve-s",
    10.0,
    "How long a Binding whose answer was lost (a 5xx, a timeout, a broken connection) is "
    "sent again until one is sure, before its pod's lease is kept for the pod's next try.",
)
@seconds_option("--api-timeout-s", 30.0, API_TIMEOUT_HELP)
@seconds_option("--discovery-interval-s", 10.0, "How often the agents' EndpointSlices are read.")
@seconds_option(
    "--node-state-interval-s",
    30.0,
    "How often each node's label gpushare.io/ready and condition GpushareReady are published.",
)
@leader_options(
    elect_help="Run the lease controller and the node-state publisher only in the replica that "
    "holds a coordination.k8s.io Lease (the extender and the webhook run in every replica).",
    namespace_help="Namespace of the leader election's Lease.",
    lease="gpushare-kube-serve",
)
@log_level_option()
def kube_serve(**options: Any) -> None:
    """Run the extender, the lease controller and the node-state publisher (and the
    webhook with --webhook-listen) until SIGTERM or SIGINT.

    Exits 2 on a bad option or when neither --api-server nor an in-cluster service
    account is there, 1 when a part fails at run time.
    """
    from agent.cli.logs import setup_logging
    from agent.legacy.cluster.binder import BindOptions
    from agent.legacy.cluster.service import ClusterOptions

    setup_logging(level=options["log_level"], fmt="text")
    _check_pairs(options)
    cluster = ClusterOptions(
        agents_namespace=options["agents_namespace"],
        agents_service=options["agents_service"],
        agent_ca_file=options["agent_ca"],
        agent_cert_file=options["agent_cert"],
        agent_key_file=options["agent_key"],
        agent_token_file=options["agent_token_file"],
        agent_server_name=options["agent_server_name"],
        insecure_agents=options["insecure_agents"],
        extender_listen=options["extender_listen"],
        webhook_listen=options["webhook_listen"],
        webhook_cert_file=options["webhook_cert"],
        webhook_key_file=options["webhook_key"],
        discovery_interval_s=options["discovery_interval_s"],
        reconcile_interval_s=options["reconcile_interval_s"],
        node_state_interval_s=options["node_state_interval_s"],
        lease_grace_s=options["lease_grace_s"],
        bind=BindOptions(
            hold_s=options["hold_s"],
            gang_ttl_s=options["gang_ttl_s"],
            resolve_s=options["bind_resolve_s"],
        ),
        leader=leader_from(options),
        require_run_as_user=options["run_as_user"] == "required",
    )
    serve_until_stopped(_serve(options, cluster))


def _check_pairs(options: dict[str, Any]) -> None:
    """Options that only make sense together, named at once."""
    webhook = []
    if options["webhook_listen"] and not (options["webhook_cert"] and options["webhook_key"]):
        webhook.append("--webhook-listen needs --webhook-cert and --webhook-key")
    check_together(options, webhook)


async def _serve(options: dict[str, Any], cluster: Any) -> None:
    from agent.legacy.cluster.service import ClusterSide

    api = api_from(options)
    side = ClusterSide(api, cluster)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    try:
        await side.start()
        waiting = asyncio.ensure_future(side.wait())
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({waiting, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if waiting.done():
            waiting.result()  # a part failed: raise it
        else:
            log.info("stopping")
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
    finally:
        await side.aclose()
        await api.aclose()


@kube.command("release-finalizers", context_settings=CONTEXT)
@api_server_options("The Kubernetes API server. Default: the pod's service account (in-cluster).")
@seconds_option("--api-timeout-s", 30.0, "How long one API request may take.")
@click.option("--dry-run", is_flag=True, help="List the pods; change nothing.")
def kube_release_finalizers(**options: Any) -> None:
    """Remove the gpushare.io/lease finalizer from every pod that still has it, and only
    that finalizer: for an uninstall, once `gpushare kube serve` (whose lease controller
    removes it as each pod ends) is gone, so that deleted share pods do not hang in
    Terminating. Their leases end with their agents. Exits 1 if one could not be removed."""
    if api_problem(options):
        fail(f"usage: {API_PROBLEM}", exits.CONFIG)
    try:
        left = asyncio.run(_release_finalizers(api_from(options), dry_run=options["dry_run"]))
    except ConfigError as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    except GpushareError as exc:
        fail(str(exc), exits.FAILURE)
    sys.exit(exits.FAILURE if left else exits.OK)


async def _release_finalizers(api: Any, *, dry_run: bool) -> int:
    """Drop the finalizer everywhere; how many pods kept it."""
    from agent.legacy.cluster.finalizer import drop_finalizer, holds_finalizer

    async with api:
        pods = [p for p in (await api.list_pods()).items if holds_finalizer(p)]
        left = 0
        for pod in pods:
            meta = pod["metadata"]
            name = f"{meta['namespace']}/{meta['name']}"
            if dry_run:
                click.echo(f"would release the finalizer of {name}")
            elif await drop_finalizer(api, pod):
                click.echo(f"released the finalizer of {name}")
            else:
                left += 1
                click.echo(f"the finalizer of {name} could not be removed (conflicts)", err=True)
        if not pods:
            click.echo("no pod holds the gpushare.io/lease finalizer")
        return left
