"""``gpushare doctor``: check a node's prerequisites and say what to fix.

This module gathers the facts (files, NVML, the Kubernetes API, the agent's socket); what
they mean is decided by the pure checks of :mod:`agent.doctor`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import click
import yaml
from click.core import ParameterSource

from agent import doctor as preflight
from agent.cli import exits
from agent.cli.client import AgentRefused, AgentUnreachable, Endpoint, get_node
from agent.cli.common import (
    CONTEXT,
    fail,
    local_socket,
    resolve_endpoint,
    resolve_settings,
    set_option,
    sim_option,
)
from agent.cli.common import assignments as parse_assignments
from agent.config import Settings, load_settings
from agent.config.loading import simulation_paths
from agent.core.errors import ConfigError, GpushareError
from agent.doctor import (
    AgentFacts,
    Finding,
    KubeFacts,
    gather,
)
from agent.dra import toolkit
from agent.runtime import effective

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@click.command(context_settings=CONTEXT)
@sim_option("Check a simulated node's settings (as `serve --sim` resolves them).")
@set_option("dra.enabled=true")
@click.option(
    "--api-server",
    envvar="GPUSHARE_KUBE_API_SERVER",
    metavar="URL",
    default="",
    help="The Kubernetes API server to ask for the node label and the RuntimeClass. "
    "Default: dra.api_server, else the pod's service account; none: those checks are "
    "skipped. Env: GPUSHARE_KUBE_API_SERVER.",
)
@click.option("--api-token-file", metavar="FILE", default="", help="Bearer token for --api-server.")
@click.option("--api-ca", metavar="FILE", default="", help="CA of --api-server's certificate.")
@click.option(
    "--node", "node_name", metavar="NAME", help="The node's name. Default: runtime.node_name."
)
@click.option(
    "--runtime-class",
    default="nvidia",
    show_default=True,
    metavar="NAME",
    help="The RuntimeClass the agent's and the workloads' pods run under.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for the agent and for each API request.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def doctor(
    ctx: click.Context,
    sim: str | None,
    assignments: tuple[str, ...],
    api_server: str,
    api_token_file: str,
    api_ca: str,
    node_name: str | None,
    runtime_class: str,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Check this node's prerequisites, each on a line: ok, warn, fail or skip, what was
    found and, for what is wrong, the fix.

    Checks the MPS control binary and that its release is the running driver's, the node
    label and the RuntimeClass (when a Kubernetes API can be asked), the MPS pipe and shm
    directories, the kubelet plugin and CDI directories, the TLS certificates' expiry and
    that the agent answers. Run it on the node (or in the agent's pod) as the agent's user.
    Settings: those of the agent running on the socket, unless --config, --sim or --set
    are given. Exit 0 when no check fails, 1 when one does, 2 on a usage error.
    """
    if (api_token_file or api_ca) and not api_server:
        fail("usage: --api-token-file and --api-ca go with --api-server", exits.CONFIG)
    settings, note = _settings(ctx, sim, assignments)
    click.echo(f"gpushare doctor: {note}", err=True)
    findings = run_checks(
        settings,
        where=resolve_endpoint(ctx, settings),
        kube=lambda: _kube_facts(
            settings,
            api_server=api_server,
            token_file=api_token_file,
            ca_file=api_ca,
            node_name=node_name or settings.runtime.node_name,
            runtime_class=runtime_class,
            timeout_s=timeout_s,
        ),
        timeout_s=timeout_s,
    )
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(f) for f in findings], indent=2))
    else:
        click.echo("\n".join(preflight.render(findings)))
    sys.exit(exits.FAILURE if preflight.failed(findings) else exits.OK)


def _settings(ctx: click.Context, sim: str | None, items: tuple[str, ...]) -> tuple[Settings, str]:
    """The running agent's settings with --set applied, unless --config or --sim name
    others (or no agent runs): then what the file, the environment and --set resolve to."""
    flags = parse_assignments(items, sim)
    settings = simulation_paths(resolve_settings(ctx.find_root(), flags))
    named = ctx.find_root().get_parameter_source("config") is ParameterSource.COMMANDLINE
    if named or sim is not None:
        return settings, "checking the settings of --config/--sim/--set"
    socket = local_socket(ctx, settings)
    record = effective.running(socket)
    if record is None:
        return settings, f"no agent runs on {socket}: checking what the settings resolve to here"
    text = yaml.safe_dump(record["settings"], sort_keys=False)
    try:
        agents = load_settings(text, env={}, overrides=flags, source="the agent's settings")
    except ConfigError as exc:
        fail(f"configuration error: {exc}", exits.CONFIG)
    extra = " with --set" if flags else ""
    return agents, f"checking the running agent's settings{extra} (pid {record['pid']}, {socket})"


def run_checks(
    settings: Settings,
    *,
    where: str | Endpoint,
    kube: Callable[[], KubeFacts],
    timeout_s: float,
    now: datetime | None = None,
) -> list[Finding]:
    """Gather the facts and check them, in the order a node is set up."""
    agent = agent_facts(where, timeout_s)
    simulated = settings.sim.enabled or agent.simulated
    binary = gather.binary_facts(settings, simulated)
    kube_facts = kube()
    d, k = settings.dra, settings.kubelet
    toolkit = toolkit_finding(settings, simulated)
    # GPU workload pods need the RuntimeClass unless, on the DRA path alone, the claims'
    # CDI specs carry the driver
    workloads_need_it = k.enabled or not (d.enabled and toolkit.status == "ok")
    directories = (
        ("kubelet-plugin-dir", "kubelet.plugin_dir", "kubelet.enabled", k.enabled, k.plugin_dir),
        ("dra-plugin-dir", "dra.plugin_dir", "dra.enabled", d.enabled, d.plugin_dir),
        ("dra-registry-dir", "dra.registry_dir", "dra.enabled", d.enabled, d.registry_dir),
        ("cdi-dir", "dra.cdi_dir", "dra.enabled", d.enabled, d.cdi_dir),
    )
    certificates = gather.cert_facts(settings)
    return [
        preflight.check_mps_binary(simulated, binary),
        preflight.check_driver(gather.driver_facts(simulated), binary),
        preflight.check_node_label(kube_facts),
        preflight.check_runtime_class(kube_facts, workloads_need_it=workloads_need_it),
        preflight.check_device_plugin(kube_facts),
        preflight.check_mps_dirs(gather.mps_dir_facts(settings, agent_running=not agent.error)),
        preflight.check_shm(gather.shm_facts(settings)),
        toolkit,
        *(
            preflight.check_dir(name, key, switch, on, gather.path_facts(path, follow=True))
            for name, key, switch, on, path in directories
        ),
        *preflight.check_certs(certificates, now or datetime.now(UTC), gather.CERTIFICATES),
        preflight.check_agent(agent),
    ]


def toolkit_finding(settings: Settings, simulated: bool) -> preflight.Finding:
    """Whether the claims' CDI specs carry the driver's libraries and hooks (NVIDIA's
    container toolkit on the node), or pods need the NVIDIA runtime."""
    d = settings.dra
    status, found, fix = toolkit.doctor_check(d.nvidia_ctk, enabled=d.enabled, simulated=simulated)
    return preflight.Finding(status, "nvidia-toolkit", found, fix)


# -- facts -----------------------------------------------------------------------------------


def agent_facts(where: str | Endpoint, timeout_s: float) -> AgentFacts:
    name = where.target if isinstance(where, Endpoint) else where
    try:
        node = get_node(where, timeout_s=timeout_s)
    except (AgentUnreachable, AgentRefused) as exc:
        return AgentFacts(name, error=str(exc))
    return AgentFacts(
        name,
        node_name=node.node_name,
        devices=len(node.devices),
        simulated=node.simulated,
        version=node.agent_version,
    )


def _kube_facts(
    settings: Settings,
    *,
    api_server: str,
    token_file: str,
    ca_file: str,
    node_name: str,
    runtime_class: str,
    timeout_s: float,
) -> KubeFacts:
    base = KubeFacts(node_name=node_name, runtime_class=runtime_class, driver=settings.dra.enabled)
    given = "--api-token-file"
    if not api_server and settings.dra.api_server:
        api_server = settings.dra.api_server
        token_file, ca_file = settings.dra.api_token_file, settings.dra.api_ca
        given = "dra.api_token_file"
    in_pod = gather.in_pod()
    in_cluster = in_pod and os.path.exists(SERVICE_ACCOUNT_TOKEN)
    if not api_server and not in_cluster:
        return dataclasses.replace(base, why=_no_api_why(settings, in_pod))
    path = token_file if api_server else SERVICE_ACCOUNT_TOKEN
    try:
        token = Path(path).read_text() if path else ""
    except OSError as exc:
        return dataclasses.replace(base, why=f"cannot read {path}: {exc.strerror}")
    if api_server:
        identity = f"the token of {given} {token_file}" if token_file else "an anonymous client"
    else:
        identity = "the pod's service account"
    base = dataclasses.replace(base, identity=identity, user=token_user(token))
    try:
        return asyncio.run(
            _ask_kube(base, api_server, token if api_server else "", ca_file, timeout_s)
        )
    except GpushareError as exc:
        return dataclasses.replace(base, why=str(exc))


def _no_api_why(settings: Settings, in_pod: bool) -> str:
    if not in_pod:
        return "not in a cluster, and neither --api-server nor dra.api_server is set"
    if settings.dra.enabled:
        return (
            f"this pod has no service-account token ({SERVICE_ACCOUNT_TOKEN}), which the DRA "
            "driver needs (the chart projects one into the agent's container)"
        )
    return (
        "this pod has no service-account token: on the extender path the agent calls no "
        "Kubernetes API, so the chart mounts none; give --api-server and --api-token-file "
        "to check the node and the RuntimeClass"
    )


def token_user(token: str) -> str:
    """The user a service-account token (a JWT) names in its ``sub``; "" when it names none."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        return ""
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return ""
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return sub if isinstance(sub, str) else ""


async def _ask_kube(
    base: KubeFacts, api_server: str, token: str, ca_file: str, timeout_s: float
) -> KubeFacts:
    from agent.kubeapi.port import KubeError, NotFound
    from agent.kubeapi.rest import RestKubeApi

    if api_server:
        api = RestKubeApi.from_url(api_server, token=token, ca_file=ca_file, timeout_s=timeout_s)
    else:
        api = RestKubeApi.in_cluster(timeout_s=timeout_s)
    facts = dataclasses.replace(base, api=api.host)
    async with api:
        try:
            facts = dataclasses.replace(facts, node=await api.get_node(base.node_name))
        except KubeError as exc:
            facts = dataclasses.replace(facts, node_error=str(exc), node_status=exc.status)
        try:
            await api.get_runtime_class(base.runtime_class)
            facts = dataclasses.replace(facts, runtime_class_found=True)
        except NotFound:
            facts = dataclasses.replace(facts, runtime_class_found=False)
        except KubeError as exc:
            facts = dataclasses.replace(
                facts, runtime_class_error=str(exc), runtime_class_status=exc.status
            )
    return facts
