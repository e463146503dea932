"""certificates.mode generated (the chart's own CA, no cert-manager), by what the rendered
Secrets do:

- each certificate chains to the rendered CA, for the purpose its peer checks (server or
  client) and, for a server, the name its peer dials: the scheduler and the DRA controller
  reach each agent at its pod address with the name they are given
  (--agent-server-name), the API server reaches the webhook at its Service's name;
- a real agent (the simulated node) serving with the rendered agent Secret answers the DRA
  controller's and the scheduler's own clients, built from their rendered Secrets and
  arguments, and refuses a client certificate of another release's CA;
- the webhook served with its rendered Secret is trusted by a client holding the webhook
  configurations' rendered caBundle;
- every object of each path validates for its Kubernetes versions
  (tests/deploy/test_chart.py, certificate option "generated").
Kept across upgrades and renewed near expiry: tests/deploy/test_helm_live.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.dracontrol.agents import AgentsOptions
from agent.dracontrol.agents import connector as controller_connector
from agent.legacy.cluster.service import ClusterOptions
from agent.legacy.cluster.service import connector as scheduler_connector
from agent.legacy.cluster.webhook import serve_webhook
from agent.runtime.app import App
from tests.deploy.test_chart import find, objects
from tests.helpers import fake_ports, running_app, short_dir, sim_settings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

NAMESPACE = "team-gpu"
VALUES = {"path": "both", "nameOverride": "gpu", "certificates": {"mode": "generated"}}
Docs = list[dict[str, Any]]


@pytest.fixture(scope="module")
def docs() -> Docs:
    return objects(VALUES, namespace=NAMESPACE)


@pytest.fixture(scope="module")
def files() -> Iterator[Path]:
    with short_dir() as root:
        yield root


def write_secret(docs: Docs, name: str, into: Path) -> Path:
    """The Secret's keys as the kubelet mounts them (keys 0600)."""
    into.mkdir(parents=True, exist_ok=True)
    secret = find(docs, "Secret", name)
    items = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    items |= {k: str(v).encode() for k, v in (secret.get("stringData") or {}).items()}
    for key, value in items.items():
        (into / key).write_bytes(value)
        os.chmod(into / key, 0o600)
    return into


def tls_files(secret: Path, prefix: str = "", *, client: Path | None = None) -> dict[str, str]:
    """A client's TLS options (``{prefix}ca_file``, ``{prefix}cert_file``,
    ``{prefix}key_file``) from a mounted Secret: its CA, and the certificate and key of
    ``client`` where given, else its own."""
    client = client or secret
    return {
        f"{prefix}ca_file": str(secret / "ca.crt"),
        f"{prefix}cert_file": str(client / "tls.crt"),
        f"{prefix}key_file": str(client / "tls.key"),
    }


def arg(docs: Docs, kind: str, name: str, flag: str) -> str:
    pod = find(docs, kind, name)["spec"]["template"]["spec"]
    args = [a for c in pod["containers"] for a in c.get("args", [])]
    found = [a.split("=", 1)[1] for a in args if a.startswith(f"{flag}=")]
    assert len(found) == 1, (name, flag, found)
    return found[0]


def openssl_verify(ca: Path, leaf: Path, purpose: str, hostname: str = "") -> str:
    """`openssl verify`'s complaint ("" when it verifies)."""
    command = ["openssl", "verify", "-CAfile", str(ca), "-purpose", purpose]
    if hostname:
        command += ["-verify_hostname", hostname]
    done = subprocess.run(
        [*command, str(leaf)], capture_output=True, text=True, timeout=30, check=False
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


# -- chain, purpose, names --------------------------------------------------------------


def test_each_certificate_verifies_for_its_purpose_and_the_name_its_peer_dials(
    docs: Docs, files: Path
) -> None:
    server_name = arg(docs, "Deployment", "gpu-dra-controller", "--agent-server-name")
    assert server_name == arg(docs, "Deployment", "gpu-scheduler", "--agent-server-name")
    assert server_name == f"gpu-agent.{NAMESPACE}.svc"
    hook = find(docs, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"]
    webhook_name = f"{hook['service']['name']}.{hook['service']['namespace']}.svc"
    ca = write_secret(docs, "gpu-ca", files / "ca") / "tls.crt"
    checks = {
        "gpushare-agent-tls": ("sslserver", server_name),
        "gpushare-webhook-tls": ("sslserver", webhook_name),
        "gpushare-scheduler-agent-tls": ("sslclient", ""),
        "gpushare-dra-controller-agent-tls": ("sslclient", ""),
    }
    for name, (purpose, hostname) in checks.items():
        leaf = write_secret(docs, name, files / name)
        assert (leaf / "ca.crt").read_bytes() == ca.read_bytes(), name
        assert openssl_verify(ca, leaf / "tls.crt", purpose, hostname) == "", name
    # the checks can fail: another name, and a certificate of another render's CA
    agent = files / "gpushare-agent-tls" / "tls.crt"
    assert "hostname mismatch" in openssl_verify(ca, agent, "sslserver", "gpu-agent.other.svc")
    other = write_secret(objects(VALUES, namespace=NAMESPACE), "gpu-ca", files / "other")
    assert openssl_verify(other / "tls.crt", agent, "sslserver", server_name) != ""


# -- real handshakes --------------------------------------------------------------------


@pytest.fixture
async def agent(docs: Docs, files: Path) -> AsyncIterator[App]:
    """The simulated node's agent serving TCP with the rendered agent Secret and token."""
    tls = write_secret(docs, "gpushare-agent-tls", files / "agent")
    token = write_secret(docs, "gpu-agent-token", files / "token") / "token"
    with short_dir() as root:
        settings = sim_settings(
            root,
            **{
                "api.tcp_listen": "127.0.0.1:0",
                "api.tls_cert_file": str(tls / "tls.crt"),
                "api.tls_key_file": str(tls / "tls.key"),
                "api.tls_client_ca_file": str(tls / "ca.crt"),
                "api.token_file": str(token),
            },
        )
        async with running_app(settings, fake_ports(1)) as app:
            yield app


async def test_the_dra_controller_and_the_scheduler_reach_the_agent(
    agent: App, docs: Docs, files: Path
) -> None:
    target = f"127.0.0.1:{agent.tcp_port}"
    token = str(files / "token" / "token")
    mine = write_secret(docs, "gpushare-dra-controller-agent-tls", files / "dra")
    dra = controller_connector(
        AgentsOptions(
            **tls_files(mine),
            token_file=token,
            server_name=arg(docs, "Deployment", "gpu-dra-controller", "--agent-server-name"),
            call_timeout_s=5,
        )
    )
    async with dra(target) as link:
        assert len((await link.get_node()).devices) == 1  # type: ignore[attr-defined]
    theirs = write_secret(docs, "gpushare-scheduler-agent-tls", files / "scheduler")
    scheduler = scheduler_connector(
        ClusterOptions(
            **tls_files(theirs, prefix="agent_"),
            agent_token_file=token,
            agent_server_name=arg(docs, "Deployment", "gpu-scheduler", "--agent-server-name"),
        )
    )
    async with scheduler(target) as link:
        assert len((await link.get_node()).devices) == 1  # type: ignore[attr-defined]


async def test_a_client_of_another_release_s_ca_is_refused(
    agent: App, docs: Docs, files: Path
) -> None:
    other = write_secret(
        objects(VALUES, namespace=NAMESPACE),
        "gpushare-dra-controller-agent-tls",
        files / "intruder",
    )
    mine = files / "dra"  # the agent's CA is trusted: only the client certificate differs
    write_secret(docs, "gpushare-dra-controller-agent-tls", mine)
    connect = controller_connector(
        AgentsOptions(
            **tls_files(mine, client=other),
            token_file=str(files / "token" / "token"),
            server_name=f"gpu-agent.{NAMESPACE}.svc",
            call_timeout_s=2,
        )
    )
    async with connect(f"127.0.0.1:{agent.tcp_port}") as link:
        with pytest.raises(Exception, match="UNAVAILABLE"):
            await link.get_node()  # type: ignore[attr-defined]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_api_server_trusts_the_webhook_through_the_rendered_ca_bundle(
    docs: Docs, files: Path
) -> None:
    tls = write_secret(docs, "gpushare-webhook-tls", files / "webhook")
    port = free_port()
    server = asyncio.create_task(
        serve_webhook("127.0.0.1", port, str(tls / "tls.crt"), str(tls / "tls.key"))
    )
    for configuration in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hook = find(docs, configuration)["webhooks"][0]["clientConfig"]
        bundle = base64.b64decode(hook["caBundle"]).decode()
        service = f"{hook['service']['name']}.{hook['service']['namespace']}.svc"
        context = ssl.create_default_context(cadata=bundle)  # as the API server: this CA only
        for _ in range(50):
            try:
                async with aiohttp.ClientSession() as session:
                    url = f"https://127.0.0.1:{port}/healthz"
                    async with session.get(url, ssl=context, server_hostname=service) as answer:
                        assert answer.status == 200
                break
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc, aiohttp.ClientConnectorCertificateError):
                    raise
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the webhook did not start")
    server.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await server
