"""``gpushare kube wait-rollout daemonset/NAME``: wait until every pod of a DaemonSet is
ready (the uninstall hook's wait for its compute-mode reset on each node), after deleting
another one (``--delete-first``: the agents')."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click

from agent.cli import exits
from agent.cli.common import CONTEXT, fail
from agent.cli.options import API_PROBLEM, api_problem, api_server_options, seconds_option
from agent.core.errors import ConfigError, GpushareError
from agent.kubeapi.rollout import RolloutRefused


def _target(_ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    if value is None:
        return ""
    kind, sep, name = value.partition("/")
    if not sep or kind.lower() not in ("daemonset", "daemonsets", "ds") or not name:
        raise click.BadParameter(f"{value!r} is not daemonset/NAME", param=param)
    return name


@click.command("wait-rollout", context_settings=CONTEXT)
@click.argument("target", metavar="daemonset/NAME", callback=_target)
@click.option("--namespace", "-n", required=True, help="The DaemonSet's namespace.")
@seconds_option(
    "--timeout-s",
    90.0,
    "How long to wait; then exit 1 naming the nodes whose pods are not ready.",
)
@seconds_option("--interval-s", 2.0, "Between two reads of the DaemonSet.")
@click.option(
    "--delete-first",
    metavar="daemonset/OTHER",
    callback=_target,
    help="First delete the DaemonSet OTHER of the same namespace (propagationPolicy "
    "Background; one already gone is fine), then wait.",
)
@api_server_options("The Kubernetes API server. Default: the pod's service account (in-cluster).")
@seconds_option("--api-timeout-s", 30.0, "How long one API request may take.")
def kube_wait_rollout(target: str, **options: Any) -> None:
    """Wait until the DaemonSet's controller has seen its latest spec and every pod it
    schedules is ready (none unavailable), printing ready/desired as it changes. A
    DaemonSet that selects no node is done at once. API errors are waited out.

    Exits 0 when done; 1 on the timeout, with each node whose pod is not ready and why
    (or when --delete-first failed 5 times); 2 on a usage error, without a service
    account, or when the API server refuses the account (401, 403: RBAC needs `get`
    daemonsets and `list` pods, and `delete` on the one --delete-first names)."""
    if api_problem(options):
        fail(f"usage: {API_PROBLEM}", exits.CONFIG)
    try:
        done = asyncio.run(_wait(target, options))
    except ConfigError as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    except RolloutRefused as exc:
        fail(f"the API server refused: {exc}", exits.CONFIG)
    except GpushareError as exc:
        fail(str(exc), exits.FAILURE)
    sys.exit(exits.OK if done else exits.FAILURE)


async def _wait(name: str, options: dict[str, Any]) -> bool:
    from agent.kubeapi.rollout import delete_first, wait_rollout

    namespace = options["namespace"]
    async with _api(options) as api:
        if options["delete_first"]:
            await delete_first(api, namespace, options["delete_first"], echo=click.echo)
        return await wait_rollout(
            api,
            namespace,
            name,
            timeout_s=options["timeout_s"],
            interval_s=options["interval_s"],
            echo=click.echo,
        )


def _api(options: dict[str, Any]) -> Any:
    """The DaemonSet client: --api-server with its token and CA, else the pod's service
    account (as every cluster-side command)."""
    from agent.kubeapi.apps import RestDaemonSetApi

    timeout_s = options["api_timeout_s"]
    if not options["api_server"]:
        return RestDaemonSetApi.in_cluster(timeout_s=timeout_s)
    token = Path(options["api_token_file"]).read_text() if options["api_token_file"] else ""
    return RestDaemonSetApi.from_url(
        options["api_server"], token=token, ca_file=options["api_ca"], timeout_s=timeout_s
    )
