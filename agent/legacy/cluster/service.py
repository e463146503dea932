"""The cluster side's composition root (``gpushare kube serve``): one process holds the
agents' cache, the extender (beside kube-scheduler), the lease controller and, if asked,
the admission webhook. They share one identity towards the agents: a lease made by the
extender is released by the controller as its owner."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from agent.admission.policy import Rules
from agent.client import AgentClient
from agent.client.credentials import AgentSecrets, agent_token
from agent.config import filewatch
from agent.kubeapi.endpoints import targets_from_slices
from agent.kubeapi.leader import LeaderElector, LeaderOptions
from agent.kubeapi.port import KubeApi, KubeError
from agent.legacy.cluster.agents import AgentLink, Connect
from agent.legacy.cluster.binder import Binder, BindOptions
from agent.legacy.cluster.cache import AgentCache
from agent.legacy.cluster.controller import LeaseController
from agent.legacy.cluster.extender import Extender, build_extender_app
from agent.legacy.cluster.nodestate import publish_node_states

log = logging.getLogger(__name__)

CERT_CHECK_S = 30.0  # how often the webhook's certificate files are checked for a change


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    agents_namespace: str = "gpushare-system"
    agents_service: str = "gpushare-agent"
    agent_ca_file: str = ""  # TLS towards the agents: their CA
    agent_cert_file: str = ""  # mutual TLS: this side's certificate and key
    agent_key_file: str = ""
    agent_token_file: str = ""  # or a bearer token over TLS
    # the name the agents' certificates carry: they are reached by pod address
    agent_server_name: str = "gpushare-agent.gpushare-system.svc"
    insecure_agents: bool = False  # plaintext to the agents (tests and kind only)
    extender_listen: str = "127.0.0.1:8888"  # kube-scheduler runs in the same pod
    webhook_listen: str = ""  # "0.0.0.0:8443" with the two files below; "" for none
    webhook_cert_file: str = ""
    webhook_key_file: str = ""
    discovery_interval_s: float = 10.0
    bind: BindOptions = field(default_factory=BindOptions)
    reconcile_interval_s: float = 60.0
    node_state_interval_s: float = 30.0
    lease_grace_s: float = 60.0  # a younger lease may belong to a bind in flight
    rules: Rules = field(default_factory=Rules)
    # a share pod must state the one UID its share runs as (``--run-as-user required``):
    # the webhook, the extender's filter and its bind refuse one that does not
    require_run_as_user: bool = True
    # the controller and the node-state publisher in the Lease holder only; None: here
    leader: LeaderOptions | None = None


def connector(options: ClusterOptions) -> Connect:
    """target -> an AgentClient in ``async with``. The token is read again at each call
    once its file changed (a rotation takes effect on the connections already open); the
    TLS files at each connection. Files that cannot be read then leave the last ones read
    in use."""
    known = AgentSecrets(
        options.agent_ca_file,
        cert_file=options.agent_cert_file,
        key_file=options.agent_key_file,
        insecure=options.insecure_agents,
    )
    token = agent_token(options.agent_token_file)

    def connect(target: str) -> contextlib.AbstractAsyncContextManager[AgentLink]:
        return AgentClient(
            target,
            token=token,
            credentials=known.current(),
            server_name=options.agent_server_name if not options.insecure_agents else "",
            attempts=2,
        )

    return connect


async def discover(api: KubeApi, cache: AgentCache, options: ClusterOptions) -> None:
    """Follow the agents' headless Service: its EndpointSlices name one agent per node."""
    while True:
        try:
            slices = await api.list_endpoint_slices(
                options.agents_namespace, options.agents_service
            )
            cache.set_targets(targets_from_slices(slices))
        except KubeError as exc:
            log.warning("cannot list the agents' endpoints: %s", exc)
        await asyncio.sleep(options.discovery_interval_s)


@contextlib.asynccontextmanager
async def site(
    app: web.Application, listen: str, tls: ssl.SSLContext | None = None
) -> AsyncIterator[web.TCPSite]:
    host, _, port = listen.rpartition(":")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    served = web.TCPSite(runner, host.strip("[]") or "0.0.0.0", int(port), ssl_context=tls)
    await served.start()
    try:
        yield served
    finally:
        await runner.cleanup()


class ClusterSide:
    """Start, then serve until :meth:`aclose`; ``extender_port`` is the bound port."""

    def __init__(self, api: KubeApi, options: ClusterOptions) -> None:
        self.api = api
        self.options = options
        self.cache = AgentCache(connector(options))
        self.controller = LeaseController(
            api,
            self.cache,
            reconcile_interval_s=options.reconcile_interval_s,
            grace_s=options.lease_grace_s,
        )
        # the binder reads a pod from the controller's informer, not from the API per bind
        require_user = options.require_run_as_user
        self.binder = Binder(
            api, self.cache, options.bind, pods=self.controller.pod, require_user=require_user
        )
        self.extender = Extender(self.cache, self.binder, options.rules, require_user=require_user)
        self.extender_port = 0
        self.webhook_port = 0
        self.elector: LeaderElector | None = None
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        stack, options = self._stack, self.options
        stack.push_async_callback(self.cache.aclose)
        stack.push_async_callback(self.binder.aclose)  # before the agents' links close
        served = await stack.enter_async_context(
            site(build_extender_app(self.extender), options.extender_listen)
        )
        self.extender_port = _port_of(served)
        log.info("extender serving on %s (port %d)", options.extender_listen, self.extender_port)
        if options.webhook_listen:
            from agent.legacy.cluster.webhook import build_webhook_app

            tls = ReloadingTls(options.webhook_cert_file, options.webhook_key_file)
            hooked = await stack.enter_async_context(
                site(
                    build_webhook_app(require_user=options.require_run_as_user),
                    options.webhook_listen,
                    tls.context,
                )
            )
            self.webhook_port = _port_of(hooked)
            log.info("webhook serving on %s (port %d)", options.webhook_listen, self.webhook_port)
            self._tasks.append(
                asyncio.create_task(reload_certificate(tls), name="webhook-certificate")
            )
        self._tasks += [
            asyncio.create_task(discover(self.api, self.cache, options), name="agent-discovery"),
            asyncio.create_task(self.controller.follow(), name="pod-informer"),
        ]
        if options.leader is None:
            self._tasks.append(asyncio.create_task(self._write_side(), name="write-side"))
        else:
            self.elector = LeaderElector(self.api, options.leader)
            self._tasks.append(asyncio.create_task(self._campaign(), name="leader-election"))

    async def _campaign(self) -> None:
        """Stand for leader once the pods are in view (a replica that cannot list them
        could not act on them)."""
        assert self.elector is not None
        await self.controller.wait_synced()
        await self.elector.run(self._write_side)

    async def _write_side(self) -> None:
        """The parts that write to the cluster: one replica's at a time. A failure of one
        ends both and is raised as it is."""
        parts = [
            asyncio.create_task(self.controller.act(), name="lease-controller"),
            asyncio.create_task(
                publish_node_states(
                    self.api,
                    self.cache,
                    self.options.rules,
                    interval_s=self.options.node_state_interval_s,
                ),
                name="node-state",
            ),
        ]
        try:
            done, _ = await asyncio.wait(parts, return_when=asyncio.FIRST_COMPLETED)
            raise_ended(done)
        finally:
            for part in parts:
                part.cancel()
            await asyncio.gather(*parts, return_exceptions=True)

    async def wait(self) -> None:
        """Until a task ends, which none does on its own (its failure is raised), or
        :meth:`aclose`."""
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        raise_ended(done)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stack.aclose()


def raise_ended(done: set[asyncio.Task[None]]) -> None:
    """Tasks that run until cancelled ended: raise the first one's failure, or say that it
    ended (returned, or cancelled by something else than its owner)."""
    for task in done:
        if task.cancelled():
            raise RuntimeError(f"{task.get_name()} was cancelled")
        if (failure := task.exception()) is not None:
            raise failure
        raise RuntimeError(f"{task.get_name()} ended")


class ReloadingTls:
    """The webhook's TLS: ``context`` is the listener's; each handshake is handed the
    newest good pair (``current``), so a reload never touches a context in use and a pair
    that does not load leaves the previous one serving."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.files = (cert_file, key_file)
        self.stamp = filewatch.stamps(self.files)  # before the load: a change meanwhile is seen
        self.current = _server_context(*self.files)
        self.context = _server_context(*self.files)
        self.context.sni_callback = self._pick

    def _pick(self, connection: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        connection.context = self.current

    def reload(self) -> None:
        """Load the files again (OSError, ssl.SSLError: the previous pair stays)."""
        self.current = _server_context(*self.files)


def _server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


async def reload_certificate(tls: ReloadingTls, interval_s: float = CERT_CHECK_S) -> None:
    """Reload whenever either file changes (cert-manager and kubelet-mounted Secrets rotate
    them in place): new connections get the new pair. A pair that does not load (caught
    between the two writes) is tried again at the next check."""

    def take() -> bool:
        try:
            tls.reload()
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "webhook certificate %s not reloaded (previous kept): %s", tls.files[0], exc
            )
            return False
        log.info("webhook certificate %s reloaded", tls.files[0])
        return True

    await filewatch.reload_on_change(tls.files, interval_s, take, seen=tls.stamp)


def _port_of(served: web.TCPSite) -> int:
    server = served._server  # aiohttp keeps the asyncio server here
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else 0


async def run_cluster_side(api: KubeApi, options: ClusterOptions) -> None:
    """Serve until cancelled or a part fails."""
    side = ClusterSide(api, options)
    await side.start()
    try:
        await side.wait()
    finally:
        await side.aclose()
