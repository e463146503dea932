"""``gpushare kube serve``: the cluster side of the Kubernetes integration (the extender
beside a second kube-scheduler, the lease controller, the node-state publisher and, if
asked, the admission webhook), in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from agent.cli import exits
from agent.cli.common import CONTEXT, fail
from agent.core.errors import ConfigError, GpushareError

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def file_option(flag: str, text: str) -> Callable[[F], F]:
    """An option naming a file this process must be able to read (empty: none)."""
    return click.option(flag, metavar="FILE", default="", callback=_file, help=text)


def seconds_option(flag: str, default: float, text: str) -> Callable[[F], F]:
    """A duration in seconds, above 0."""
    return click.option(
        flag, type=float, default=default, show_default=True, callback=_positive, help=text
    )


@click.group(context_settings=CONTEXT)
def kube() -> None:
    """The cluster side of the Kubernetes integration (see docs/kubernetes.md)."""


def _file(_ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A file option: empty, or a file this process can read."""
    if value and not Path(value).is_file():
        raise click.BadParameter(f"{value}: no such file", param=param)
    return value


def _listen(_ctx: click.Context, param: click.Parameter, value: str) -> str:
    """HOST:PORT with a port number, or empty."""
    if not value:
        return value
    _, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT", param=param)
    return value


def _positive(_ctx: click.Context, param: click.Parameter, value: float) -> float:
    if value <= 0:
        raise click.BadParameter(f"{value:g} must be above 0", param=param)
    return value


@kube.command("serve", context_settings=CONTEXT)
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
    help="The agents' headless Service; its EndpointSlices (port 'grpc') name one agent per node.",
)
@file_option("--agent-ca", "CA of the agents' certificates (TLS towards the agents).")
@file_option("--agent-cert", "This side's certificate, for mutual TLS with the agents.")
@file_option("--agent-key", "The key of --agent-cert.")
@file_option(
    "--agent-token-file",
    "Bearer token towards the agents (over TLS, or plaintext with --insecure-agents).",
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
@seconds_option(
    "--api-timeout-s",
    30.0,
    "How long one request to the API server may take before its answer is given up "
    "(a watch: how long it may stay silent past its own timeout).",
)
@seconds_option("--discovery-interval-s", 10.0, "How often the agents' EndpointSlices are read.")
@seconds_option(
    "--node-state-interval-s",
    30.0,
    "How often each node's label gpushare.io/ready and condition GpushareReady are published.",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=True,
    show_default=True,
    help="Run the lease controller and the node-state publisher only in the replica that "
    "holds a coordination.k8s.io Lease (the extender and the webhook run in every replica).",
)
@click.option(
    "--leader-elect-namespace",
    default="gpushare-system",
    show_default=True,
    help="Namespace of the leader election's Lease.",
)
@click.option(
    "--leader-elect-lease",
    default="gpushare-kube-serve",
    show_default=True,
    help="Name of the leader election's Lease.",
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
def kube_serve(**options: Any) -> None:
    """Run the extender, the lease controller and the node-state publisher (and the
    webhook with --webhook-listen) until SIGTERM or SIGINT.

    Exits 2 on a bad option or when neither --api-server nor an in-cluster service
    account is there, 1 when a part fails at run time.
    """
    from agent.kube.binder import BindOptions
    from agent.kube.service import ClusterOptions
    from agent.runtime.logs import setup_logging

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
        leader=_leader(options),
    )
    try:
        asyncio.run(_serve(options, cluster))
    except ConfigError as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    except GpushareError as exc:
        fail(str(exc), exits.FAILURE)
    sys.exit(exits.OK)


def _check_pairs(options: dict[str, Any]) -> None:
    """Options that only make sense together, named at once."""
    problems = []
    if bool(options["agent_cert"]) != bool(options["agent_key"]):
        problems.append("--agent-cert and --agent-key go together")
    if options["webhook_listen"] and not (options["webhook_cert"] and options["webhook_key"]):
        problems.append("--webhook-listen needs --webhook-cert and --webhook-key")
    if not options["insecure_agents"] and not options["agent_ca"]:
        problems.append("--agent-ca is needed (TLS towards the agents), or --insecure-agents")
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
            lease_duration_s=options["leader_elect_lease_duration_s"],
            renew_deadline_s=options["leader_elect_renew_deadline_s"],
            retry_period_s=options["leader_elect_retry_period_s"],
        )
    except ValueError as exc:
        fail(f"usage: {exc}", exits.CONFIG)


def _api(options: dict[str, Any]) -> Any:
    from agent.kubeapi.rest import RestKubeApi

    timeout_s = options["api_timeout_s"]
    if not options["api_server"]:
        return RestKubeApi.in_cluster(timeout_s=timeout_s)
    token = Path(options["api_token_file"]).read_text() if options["api_token_file"] else ""
    return RestKubeApi.from_url(
        options["api_server"], token=token, ca_file=options["api_ca"], timeout_s=timeout_s
    )


async def _serve(options: dict[str, Any], cluster: Any) -> None:
    from agent.kube.service import ClusterSide

    api = _api(options)
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
@click.option(
    "--api-server",
    envvar="GPUSHARE_KUBE_API_SERVER",
    metavar="URL",
    default="",
    help="The Kubernetes API server. Default: the pod's service account (in-cluster).",
)
@file_option("--api-token-file", "Bearer token for --api-server.")
@file_option("--api-ca", "CA of --api-server's certificate.")
@seconds_option("--api-timeout-s", 30.0, "How long one API request may take.")
@click.option("--dry-run", is_flag=True, help="List the pods; change nothing.")
def kube_release_finalizers(**options: Any) -> None:
    """Remove the gpushare.io/lease finalizer from every pod that still has it, and only
    that finalizer: for an uninstall, once `gpushare kube serve` (whose lease controller
    removes it as each pod ends) is gone, so that deleted share pods do not hang in
    Terminating. Their leases end with their agents. Exits 1 if one could not be removed."""
    if (options["api_token_file"] or options["api_ca"]) and not options["api_server"]:
        fail("usage: --api-token-file and --api-ca go with --api-server", exits.CONFIG)
    try:
        left = asyncio.run(_release_finalizers(_api(options), dry_run=options["dry_run"]))
    except ConfigError as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    except GpushareError as exc:
        fail(str(exc), exits.FAILURE)
    sys.exit(exits.FAILURE if left else exits.OK)


async def _release_finalizers(api: Any, *, dry_run: bool) -> int:
    """Drop the finalizer everywhere; how many pods kept it."""
    from agent.kube.finalizer import drop_finalizer, holds_finalizer

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
