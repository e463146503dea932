"""The scheduler's TCP listener from settings, and the reload of its secrets: on SIGHUP,
and when their files change."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from agent.aio.tasks import Supervisor
from agent.api.auth import ReloadableTls, TlsFiles, TokenHolder
from agent.api.grpc_server import AgentService
from agent.api.identity import Identify, TcpIdentify, local, observers_of
from agent.api.ports import ClaimAnswers, EventFeed, NodeApi
from agent.api.server import GrpcServer
from agent.config import filewatch
from agent.config.api import ApiSettings
from agent.config.filewatch import Stamp

log = logging.getLogger(__name__)


def agent_service(
    node: NodeApi, events: EventFeed, max_batch: int, claims: ClaimAnswers
) -> Callable[..., AgentService]:
    """The agent service of a listener, its callers identified by ``identify`` (``admin``:
    the local socket's admin RPCs allowed)."""

    def service(identify: Identify = local, *, admin: bool = False) -> AgentService:
        return AgentService(
            node, events, admin=admin, max_batch=max_batch, identify=identify, claims=claims
        )

    return service


def tcp_server(api: ApiSettings, service: Callable[[Identify], AgentService]) -> GrpcServer:
    """The TCP listener with its token and certificates, read now (ConfigError if bad),
    serving ``service`` with callers identified by certificate or token name.

    ``checks.check_tcp_listen`` has already refused a combination that authenticates nobody.
    """
    tls = None
    if api.tls_cert_file:
        tls = ReloadableTls(TlsFiles(api.tls_cert_file, api.tls_key_file, api.tls_client_ca_file))
    token = TokenHolder(api.token_file) if api.token_file else None
    identify = TcpIdentify(token, observers_of(api.observers))
    return GrpcServer(
        service(identify), address=api.tcp_listen, key="api.tcp_listen", token=token, tls=tls
    )


def reload_secrets(servers: Sequence[GrpcServer]) -> list[str]:
    """Re-read every listener's token and certificates (on SIGHUP). Live calls and streams
    go on; new calls and handshakes use the new material. What fails keeps the old one."""
    problems = [problem for server in servers for problem in server.reload()]
    for problem in problems:
        log.error("reload: kept the previous secret: %s", problem)
    if not problems:
        log.info("reload: token and certificates re-read")
    return problems


def secret_files(api: ApiSettings) -> list[str]:
    names = (api.token_file, api.tls_cert_file, api.tls_key_file, api.tls_client_ca_file)
    return [name for name in names if name]


def reload_changed(servers: Sequence[GrpcServer]) -> Callable[[], bool]:
    """For :func:`agent.config.filewatch.reload_on_change`: reload as SIGHUP does; taken
    when nothing failed its checks."""

    def reload() -> bool:
        log.info("reload: a token or certificate file changed")
        return not reload_secrets(servers)

    return reload


def follow_secret_files(
    api: ApiSettings,
    servers: Sequence[GrpcServer],
    supervisor: Supervisor,
    seen: tuple[Stamp | None, ...],
) -> None:
    """With a TCP listener: reload as SIGHUP does when a token or certificate file changes
    from ``seen`` on (a supervised task, every ``api.secrets_check_s``)."""
    paths = secret_files(api)
    if paths and api.tcp_listen and api.secrets_check_s > 0:
        watch = filewatch.reload_on_change(
            paths, api.secrets_check_s, reload_changed(servers), seen=seen
        )
        supervisor.spawn("secret-files", watch)
