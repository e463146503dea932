"""Options the cluster-side commands (``gpushare kube serve``, ``gpushare dra controller``)
share: the API server, the agents' connection, the leader election; their checks, and what
they build (the API client, the leader election's options)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from agent.cli import exits
from agent.cli.common import fail
from agent.core.errors import ConfigError, GpushareError

F = TypeVar("F", bound=Callable[..., Any])

API_SERVER_HELP = (
    "The Kubernetes API server (https://HOST:6443). Default: the pod's service account "
    "(in-cluster). Env: GPUSHARE_KUBE_API_SERVER."
)
API_TIMEOUT_HELP = (
    "How long one request to the API server may take before its answer is given up "
    "(a watch: how long it may stay silent past its own timeout)."
)
API_PROBLEM = "--api-token-file and --api-ca go with --api-server"


def _file(_ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A file option: empty, or a file this process can read."""
    if value and not Path(value).is_file():
        raise click.BadParameter(f"{value}: no such file", param=param)
    return value


def _positive(_ctx: click.Context, param: click.Parameter, value: float) -> float:
    if value <= 0:
        raise click.BadParameter(f"{value:g} must be above 0", param=param)
    return value


def file_option(flag: str, text: str) -> Callable[[F], F]:
    """An option naming a file this process must be able to read (empty: none)."""
    return click.option(flag, metavar="FILE", default="", callback=_file, help=text)


def seconds_option(flag: str, default: float, text: str) -> Callable[[F], F]:
    """A duration in seconds, above 0."""
    return click.option(
        flag, type=float, default=default, show_default=True, callback=_positive, help=text
    )


def name_option(flag: str, default: str, text: str) -> Callable[[F], F]:
    """A name with a default, shown in --help."""
    return click.option(flag, default=default, show_default=True, help=text)


def _stacked(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """The decorators applied in the order written (the first one's option first in
    --help), as if each were written above the command."""

    def apply(command: F) -> F:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


def api_server_options(server_help: str = API_SERVER_HELP) -> Callable[[F], F]:
    """--api-server, --api-token-file and --api-ca."""
    return _stacked(
        click.option(
            "--api-server",
            envvar="GPUSHARE_KUBE_API_SERVER",
            metavar="URL",
            default="",
            help=server_help,
        ),
        file_option("--api-token-file", "Bearer token for --api-server."),
        file_option("--api-ca", "CA of --api-server's certificate."),
    )


def agent_options(token_help: str) -> Callable[[F], F]:
    """How the agents are reached: --agent-ca, --agent-cert, --agent-key,
    --agent-token-file, --agent-server-name and --insecure-agents."""
    return _stacked(
        file_option("--agent-ca", "CA of the agents' certificates (TLS towards the agents)."),
        file_option("--agent-cert", "This side's certificate, for mutual TLS with the agents."),
        file_option("--agent-key", "The key of --agent-cert."),
        file_option("--agent-token-file", token_help),
        name_option(
            "--agent-server-name",
            "gpushare-agent.gpushare-system.svc",
            "The name the agents' certificates carry (they are reached by pod address).",
        ),
        click.option(
            "--insecure-agents",
            is_flag=True,
            help="Plaintext gRPC to the agents: for tests and kind clusters only.",
        ),
    )


def leader_options(
    *, elect_help: str, namespace_help: str, lease: str, identity: bool = False
) -> Callable[[F], F]:
    """--leader-elect/--no-leader-elect, its Lease's namespace and name (and, with
    ``identity``, --leader-elect-identity), and its three durations."""
    decorators: list[Callable[[F], F]] = [
        click.option(
            "--leader-elect/--no-leader-elect", default=True, show_default=True, help=elect_help
        ),
        name_option("--leader-elect-namespace", "gpushare-system", namespace_help),
        name_option("--leader-elect-lease", lease, "Name of the leader election's Lease."),
    ]
    if identity:
        decorators.append(
            click.option(
                "--leader-elect-identity",
                default="",
                help="This replica's name in the Lease. Default: the pod's name and a random "
                "suffix.",
            )
        )
    return _stacked(
        *decorators,
        seconds_option(
            "--leader-elect-lease-duration-s",
            15.0,
            "How long the other replicas wait, after the leader's last renewal they saw, to "
            "take over.",
        ),
        seconds_option(
            "--leader-elect-renew-deadline-s",
            10.0,
            "How long the leader goes on without a renewal before it stops (below the duration).",
        ),
        seconds_option(
            "--leader-elect-retry-period-s",
            2.0,
            "Between two reads of the Lease, by the leader and the candidates.",
        ),
    )


def log_level_option() -> Callable[[F], F]:
    return click.option(
        "--log-level",
        default="info",
        show_default=True,
        type=click.Choice(["debug", "info", "warning", "error"]),
    )


def check_together(
    options: dict[str, Any], others: Sequence[str] = (), *, agent_auth: bool = False
) -> None:
    """Options that only make sense together, named at once (exits 2): the agents' and the
    API server's, with the command's own ``others`` after the --agent-cert/--agent-key pair;
    with ``agent_auth``, the agents need a certificate or a token."""
    problems = []
    if bool(options["agent_cert"]) != bool(options["agent_key"]):
        problems.append("--agent-cert and --agent-key go together")
    problems.extend(others)
    if not options["insecure_agents"] and not options["agent_ca"]:
        problems.append("--agent-ca is needed (TLS towards the agents), or --insecure-agents")
    if agent_auth and not options["agent_cert"] and not options["agent_token_file"]:
        problems.append("the agents need --agent-cert/--agent-key or --agent-token-file (or both)")
    if api_problem(options):
        problems.append(API_PROBLEM)
    if problems:
        fail("usage: " + "; ".join(problems), exits.CONFIG)


def api_problem(options: dict[str, Any]) -> bool:
    """--api-token-file or --api-ca without --api-server."""
    return bool((options["api_token_file"] or options["api_ca"]) and not options["api_server"])


def leader_from(options: dict[str, Any]) -> Any:
    """The leader election's options (None with --no-leader-elect); exits 2 on bad ones."""
    from agent.kubeapi.leader import LeaderOptions

    if not options["leader_elect"]:
        return None
    try:
        return LeaderOptions(
            namespace=options["leader_elect_namespace"],
            name=options["leader_elect_lease"],
            identity=options.get("leader_elect_identity", ""),  # "": the default
            lease_duration_s=options["leader_elect_lease_duration_s"],
            renew_deadline_s=options["leader_elect_renew_deadline_s"],
            retry_period_s=options["leader_elect_retry_period_s"],
        )
    except ValueError as exc:
        fail(f"usage: {exc}", exits.CONFIG)


def api_from(options: dict[str, Any]) -> Any:
    """The API client: --api-server with its token and CA, else the pod's service account."""
    from agent.kubeapi.rest import RestKubeApi

    timeout_s = options["api_timeout_s"]
    if not options["api_server"]:
        return RestKubeApi.in_cluster(timeout_s=timeout_s)
    token = Path(options["api_token_file"]).read_text() if options["api_token_file"] else ""
    return RestKubeApi.from_url(
        options["api_server"], token=token, ca_file=options["api_ca"], timeout_s=timeout_s
    )


def serve_until_stopped(main: Coroutine[Any, Any, None]) -> NoReturn:
    """Run ``main`` and exit 0 when it returns: 2 on a ConfigError, 1 on another
    GpushareError."""
    try:
        asyncio.run(main)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    except GpushareError as exc:
        fail(str(exc), exits.FAILURE)
    sys.exit(exits.OK)
