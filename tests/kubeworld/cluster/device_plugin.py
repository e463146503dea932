"""A whole cluster on loopback, every part real except the ones no machine here runs:

* the API server is the stand-in :class:`FakeApiServer` (its formats and status codes);
* each node is a real ``gpushare serve --sim`` process on its own loopback address
  (127.0.0.N, one gRPC port for all, as a headless Service's endpoints have), with its
  kubelet device plugin registered with a :class:`FakeKubelet` (the real kubelet gRPC APIs);
* :class:`NodeKubelets` does the kubelet's part for pods bound to each node: Allocate (and
  PreStartContainer) through the agent's device plugin, then the pod's phase;
* the cluster side is the real :class:`ClusterSide` (extender, binder, lease controller,
  node-state publisher, webhook over HTTPS) in this process, or ``gpushare kube serve`` as
  a process of its own (:meth:`LoopbackCluster.spawn_cluster_side`) when a test kills it;
* :class:`SchedulerStandIn` plays the unmodified kube-scheduler that calls the extender.

A pod goes in as ``kubectl apply`` sends it: through the webhook's ``/validate`` and
``/mutate`` (as the API server's admission chain calls them), then POSTed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient
from agent.kubeapi.rest import RestKubeApi
from agent.legacy.cluster.binder import BindOptions
from agent.legacy.cluster.service import ClusterOptions, ClusterSide
from agent.legacy.deviceplugin.nri.wire import TtrpcError
from tests.agentproc import AgentProcess
from tests.certs import Pki, make_pki, make_token
from tests.helpers import agent_command, subprocess_env
from tests.kubeworld.apiserver import FakeApiServer, Obj, json_patch, pod_manifest
from tests.kubeworld.cluster.common import (
    eventually,  # noqa: F401 (this path's tests wait with it)
    node_settings,
    set_flags,
)
from tests.kubeworld.kubelet.device_plugin import FakeKubelet, FakeKubeletError, Outcome
from tests.kubeworld.scheduler import SchedulerStandIn
from tests.nri.runtime import FakeNriRuntime

API_TOKEN = "api-" + "7f3a9c2e5b8d4f1a6c0e9b7d2a5f8c3e"
SHARE = "gpushare.io/share"
AGENTS_NAMESPACE = "gpushare-system"
AGENTS_SERVICE = "gpushare-agent"
USER = 1000  # the UID the test pods run as


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass
class Node(AgentProcess):
    """One simulated GPU node: its agent process and its kubelet."""

    name: str
    address: str
    port: int
    root: Path
    kubelet: FakeKubelet
    token_file: Path
    process: subprocess.Popen[bytes] | None = None
    extra: tuple[str, ...] = ()
    nri: FakeNriRuntime | None = None  # the runtime's NRI side, when the node has one

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}"

    def command(self) -> list[str]:
        settings = node_settings(
            self.root,
            **{
                "api.token_file": self.token_file,
                "api.insecure_loopback": "true",
                "kubelet.enabled": "true",
                "kubelet.plugin_dir": self.kubelet.plugin_dir,
                "kubelet.pod_resources_socket": self.kubelet.pod_resources_socket,
                "kubelet.slots": 256,
            },
        )
        if self.nri is not None:
            settings["kubelet.nri_socket"] = self.nri.socket_path
        sets = set_flags(settings)
        return agent_command(
            "--socket",
            str(self.root / "agent.sock"),
            "serve",
            "--sim",
            "--http-listen",
            "",
            "--tcp-listen",
            self.target,
            *sets,
            *self.extra,
        )


class NodeKubelets:
    """The kubelet's part for pods bound to the nodes: allocate each container that asks
    for ``gpushare.io/share`` through the agent's device plugin, keep what it got, then
    report the pod Running (or Failed when Allocate was refused, as an admission error).
    A pod being deleted or gone frees its units."""

    def __init__(self, api: RestKubeApi, server: FakeApiServer, nodes: dict[str, Node]) -> None:
        self.api = api
        self.server = server
        self.nodes = nodes
        self.got: dict[tuple[str, str, str], Outcome] = {}  # (namespace, pod, container)
        # the environment each container was created with, after the NRI plugin's adjustment
        self.created: dict[tuple[str, str, str], dict[str, str]] = {}
        self.node_of: dict[str, str] = {}  # pod uid -> node it was allocated on
        self.running: set[str] = set()  # pod uids reported Running
        # called with the pod as the kubelet saw it and the phase it reported (a benchmark
        # follows its pods this way)
        self.on_started: Callable[[Obj, str], None] | None = None
        self._seen: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def env(self, namespace: str, pod: str, container: str = "main") -> dict[str, str]:
        if (created := self.created.get((namespace, pod, container))) is not None:
            return created
        outcome = self.got[(namespace, pod, container)]
        assert outcome.response is not None, outcome.error
        return dict(outcome.response.envs)

    async def run(self) -> None:
        bound = "spec.nodeName!="
        while True:
            listing = await self.api.list_pods(field_selector=bound)
            for pod in listing.items:
                self._see(pod, deleted=False)
            with contextlib.suppress(Exception):
                async for change in self.api.watch_pods(
                    listing.resource_version, field_selector=bound
                ):
                    self._see(change.obj, deleted=change.kind == "DELETED")

    def _see(self, pod: Obj, *, deleted: bool) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        node = self.nodes.get(spec.get("nodeName", ""))
        if node is None:
            return
        if deleted or meta.get("deletionTimestamp"):
            node.kubelet.release(meta["namespace"], meta["name"])
            return
        if meta["uid"] in self._seen:
            return
        self._seen.add(meta["uid"])
        task = asyncio.create_task(self._start_pod(node, pod))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_pod(self, node: Node, pod: Obj) -> None:
        meta = pod["metadata"]
        self.node_of[meta["uid"]] = node.name
        phase = "Running"
        for container in pod["spec"]["containers"]:
            count = int(((container.get("resources") or {}).get("limits") or {}).get(SHARE, 0))
            if not count:
                continue
            outcome = await node.kubelet.allocate(
                meta["namespace"], meta["name"], container["name"], count
            )
            if outcome.failed_at == "PreStartContainer":
                await _start_again(node.kubelet, meta, container["name"], outcome)
            key = (meta["namespace"], meta["name"], container["name"])
            self.got[key] = outcome
            if node.nri is not None and outcome.response is not None and not outcome.failed_at:
                await self._create(node.nri, pod, key, outcome)
            if outcome.failed_at == "Allocate":
                phase = "Failed"  # UnexpectedAdmissionError
            elif outcome.failed_at:
                phase = "Pending"  # the container is refused: it never starts
        if phase != "Pending":
            with contextlib.suppress(Exception):  # gone meanwhile
                self.server.set_pod_phase(meta["namespace"], meta["name"], phase)
                if phase == "Running":
                    self.running.add(meta["uid"])
        if self.on_started is not None:
            self.on_started(pod, phase)

    async def _create(
        self, runtime: FakeNriRuntime, pod: Obj, key: tuple[str, str, str], outcome: Outcome
    ) -> None:
        """The runtime's CreateContainer, with the environment Allocate gave."""
        meta = pod["metadata"]
        sandbox = {k: meta.get(k) for k in ("name", "namespace", "uid", "annotations")}
        env = [f"{k}={v}" for k, v in outcome.response.envs.items()]  # type: ignore[union-attr]
        try:
            self.created[key] = (await runtime.create_container(sandbox, key[2], env)).env
        except TtrpcError as exc:  # CreateContainerError: the container never starts
            outcome.error, outcome.failed_at = exc, "CreateContainer"

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


PRE_START_RETRY_S = (0.2, 0.5, 1.0, 2.0, 4.0, 8.0)  # the pod worker's backoff, shortened


async def _start_again(kubelet: FakeKubelet, meta: Obj, container: str, outcome: Outcome) -> None:
    """A container whose PreStartContainer failed is started again, as the kubelet's pod
    worker does (with backoff, through the plugin registered then: an agent restarted in
    between answers the next one); ``outcome`` ends as the last try left it. A refusal that
    stands (the share units went with another pod's lease) is refused at every try."""
    for wait_s in PRE_START_RETRY_S:
        await asyncio.sleep(wait_s)
        try:
            again = await kubelet.pre_start(meta["namespace"], meta["name"], container)
        except FakeKubeletError:  # no plugin registered now: the next sync tries again
            continue
        outcome.error, outcome.failed_at = again.error, again.failed_at
        if again.failed_at is None:
            return


@dataclass
class LoopbackCluster:
    api_server: FakeApiServer
    root: Path
    pki: Pki
    nodes: dict[str, Node] = field(default_factory=dict)
    side: ClusterSide | None = None
    side_process: subprocess.Popen[bytes] | None = None
    extender_url: str = ""
    webhook_url: str = ""
    kube: RestKubeApi | None = None
    kubelets: NodeKubelets | None = None
    agent_token: str = ""
    api_timeout_s: float = 30.0  # the cluster side's API request timeout

    # -- parts -----------------------------------------------------------------------------

    def options(self, **overrides: Any) -> ClusterOptions:
        values: dict[str, Any] = {
            "agents_namespace": AGENTS_NAMESPACE,
            "agents_service": AGENTS_SERVICE,
            "agent_token_file": str(self.root / "agent-token"),
            "insecure_agents": True,
            "extender_listen": "127.0.0.1:0",
            "webhook_listen": "127.0.0.1:0",
            "webhook_cert_file": str(self.pki.server_cert),
            "webhook_key_file": str(self.pki.server_key),
            "discovery_interval_s": 0.5,
            "reconcile_interval_s": 1.0,
            "node_state_interval_s": 1.0,
            "lease_grace_s": 2.0,
            "bind": BindOptions(hold_s=30.0, gang_ttl_s=5.0),  # hold_s as kubelet.hold_s
        }
        values.update(overrides)
        return ClusterOptions(**values)

    async def start_cluster_side(self, **overrides: Any) -> ClusterSide:
        api = RestKubeApi.from_url(
            self.api_server.url, token=API_TOKEN, timeout_s=self.api_timeout_s
        )
        side = ClusterSide(api, self.options(**overrides))
        await side.start()
        self.side = side
        self.extender_url = f"http://127.0.0.1:{side.extender_port}"
        self.webhook_url = f"https://127.0.0.1:{side.webhook_port}"
        return side

    async def replace_cluster_side(self, scheduler: SchedulerStandIn) -> ClusterSide:
        """A new cluster side in this process, as the Deployment starts one after a crash,
        with the scheduler pointed at its extender."""
        side = await self.start_cluster_side()
        scheduler.extender_url = self.extender_url
        side.cache.set_targets({n.name: n.target for n in self.nodes.values()})
        return side

    async def stop_cluster_side(self) -> None:
        if self.side is not None:
            await self.side.aclose()
            await self.side.api.aclose()
            self.side = None

    def spawn_cluster_side(
        self, *, grace_s: float = 0.0, name: str = "cluster-side"
    ) -> subprocess.Popen[bytes]:
        """``gpushare kube serve`` as a process of its own (a test may SIGKILL it), logging
        to ``<name>.log``; another ``name`` is another replica (leader election decides
        which one runs the controller)."""
        (self.root / "api-token").write_text(API_TOKEN)
        port = free_port("127.0.0.1")
        command = agent_command(
            "kube",
            "serve",
            "--api-server",
            self.api_server.url,
            "--api-token-file",
            str(self.root / "api-token"),
            "--insecure-agents",
            "--agent-token-file",
            str(self.root / "agent-token"),
            "--extender-listen",
            f"127.0.0.1:{port}",
            # the inline cluster side's options (node state keeps its default interval)
            *_flags(self.options()),
            *("--api-timeout-s", str(self.api_timeout_s)),
            # a replica killed hands over within seconds, not 15
            *("--leader-elect-lease-duration-s", "6"),
            *("--leader-elect-renew-deadline-s", "4"),
            *("--leader-elect-retry-period-s", "0.5"),
        )
        with open(self.root / f"{name}.log", "ab") as log:
            self.side_process = subprocess.Popen(
                command, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=log
            )
        self.extender_url = f"http://127.0.0.1:{port}"
        return self.side_process

    def add_node(
        self, index: int, port: int, extra: tuple[str, ...] = (), *, nri: bool = False
    ) -> Node:
        name = f"gpu-node-{index}"
        root = self.root / name
        root.mkdir()
        token_file = root / "token"
        make_token(token_file, f"scheduler {self.agent_token}")
        node = Node(
            name,
            f"127.0.0.{index + 2}",
            port,
            root,
            FakeKubelet(root / "kubelet"),
            token_file,
            extra=extra,
            nri=FakeNriRuntime(root / "nri" / "nri.sock") if nri else None,
        )
        self.nodes[name] = node
        self.api_server.create_node(name)
        return node

    def publish_endpoints(self, *, ready: bool = True) -> None:
        port = next(iter(self.nodes.values())).port
        endpoints = [(n.name, n.address) for n in self.nodes.values() if n.process is not None]
        self.api_server.set_endpoints(
            AGENTS_NAMESPACE, AGENTS_SERVICE, endpoints, port=port, ready=ready
        )

    async def wait_agents(self, timeout_s: float = 60.0) -> None:
        """Until every running agent answers and its device plugin (and NRI plugin, where
        the node has a runtime with NRI) is registered."""
        async with asyncio.timeout(timeout_s):
            for node in self.nodes.values():
                if node.process is None:
                    continue
                await wait_agent(node, self.agent_token)
                while not node.kubelet.healthy():
                    await asyncio.sleep(0.05)
                if node.nri is not None:
                    await node.nri.configured.wait()

    # -- what a user does ------------------------------------------------------------------

    async def apply(self, pod: Obj) -> Obj:
        """``kubectl apply``: the webhook's validation and mutation, then the create. A
        refusal raises :class:`Refused` with the webhook's message."""
        review = await self._review("/validate", pod)
        if not review["allowed"]:
            raise Refused(review["status"]["message"])
        review = await self._review("/mutate", pod)
        if not review["allowed"]:
            raise Refused(review["status"]["message"])
        if patch := review.get("patch"):
            pod = json_patch(pod, json.loads(base64.b64decode(patch)))
        namespace = pod["metadata"].get("namespace", "default")
        return await self._post(f"/api/v1/namespaces/{namespace}/pods", pod)

    async def api_server_create(self, pod: Obj) -> Obj:
        """Create the pod as the webhook's mutation leaves it (for a cluster side run
        without its webhook)."""
        pod["spec"]["schedulerName"] = "gpushare"
        pod["metadata"]["finalizers"] = ["gpushare.io/lease"]
        namespace = pod["metadata"].get("namespace", "default")
        return await self._post(f"/api/v1/namespaces/{namespace}/pods", pod)

    async def _review(self, path: str, pod: Obj) -> dict[str, Any]:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": os.urandom(8).hex(),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": pod["metadata"].get("namespace", "default"),
                "operation": "CREATE",
                "object": pod,
                "userInfo": {"username": "tester"},
            },
        }
        tls = ssl.create_default_context(cafile=str(self.pki.ca))
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.webhook_url}{path}", json=review, ssl=tls) as response,
        ):
            response.raise_for_status()
            body: dict[str, Any] = await response.json()
        return dict(body["response"])

    async def _post(self, path: str, body: Obj) -> Obj:
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        async with (
            aiohttp.ClientSession(headers=headers) as session,
            session.post(f"{self.api_server.url}{path}", json=body) as response,
        ):
            answer: Obj = await response.json()
            if response.status >= 400:
                raise Refused(answer.get("message", str(response.status)))
            return answer

    async def leases(self, node: str) -> list[pb.Lease]:
        answer = await agent_call(self.nodes[node], self.agent_token, "get_node")
        return list(answer.leases)

    async def all_leases(self) -> dict[str, list[pb.Lease]]:
        return {
            name: await self.leases(name)
            for name, node in self.nodes.items()
            if node.process is not None
        }


def _flags(options: ClusterOptions) -> list[str]:
    """``gpushare kube serve``'s flags for these options' intervals, hold and TTL."""
    return [
        *("--discovery-interval-s", str(options.discovery_interval_s)),
        *("--reconcile-interval-s", str(options.reconcile_interval_s)),
        *("--hold-s", str(options.bind.hold_s)),
        *("--gang-ttl-s", str(options.bind.gang_ttl_s)),
        *("--lease-grace-s", str(options.lease_grace_s)),
    ]


class Refused(Exception):
    """What ``kubectl apply`` would print: the webhook's or the API server's refusal."""


def gpu_pod(
    name: str,
    namespace: str = "team-a",
    *,
    memory: str = "4Gi",
    threads: str = "25",
    gang: str = "",
    gang_size: int = 0,
    priority: str = "",
    run_as_user: int | None = USER,
) -> Obj:
    """A share pod as its author writes it; it runs as ``run_as_user`` (the pod's
    ``securityContext.runAsUser``: a share states its user), None for unstated."""
    annotations = {"gpushare.io/memory": memory, "gpushare.io/threads": threads}
    if gang:
        annotations |= {"gpushare.io/gang": gang, "gpushare.io/gang-size": str(gang_size)}
    if priority:
        annotations["gpushare.io/priority"] = priority
    return pod_manifest(
        name, namespace, annotations=annotations, limits={SHARE: 1}, run_as_user=run_as_user
    )


async def agent_call(node: Node, token: str, method: str, *args: Any, **kwargs: Any) -> Any:
    async with AgentClient(node.target, token=token, attempts=1) as client:
        return await getattr(client, method)(*args, **kwargs)


async def wait_agent(node: Node, token: str) -> None:
    while True:
        if node.process is not None and node.process.poll() is not None:
            raise AssertionError(f"agent on {node.name} exited:\n{node.log_text()[-3000:]}")
        try:
            await agent_call(node, token, "get_node")
            return
        except (grpc.aio.AioRpcError, OSError):
            await asyncio.sleep(0.1)


async def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s), aiohttp.ClientSession() as session:
        while True:
            if process.poll() is not None:
                raise AssertionError(f"gpushare kube serve exited with {process.returncode}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{url}/healthz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def loopback_cluster(
    root: Path,
    nodes: int = 2,
    *,
    cluster_side: str = "inline",
    scheduler: bool = True,
    agent_args: tuple[str, ...] = (),
    start_timeout_s: float = 60.0,
    nri: bool = False,
    api_timeout_s: float = 30.0,
) -> AsyncIterator[tuple[LoopbackCluster, SchedulerStandIn | None]]:
    """``nodes`` agents, their kubelets, the cluster side (``inline`` in this process,
    ``process``: ``gpushare kube serve``, without the webhook) and the scheduler stand-in
    running (``scheduler=False``: schedule by hand). ``agent_args`` go to every agent's
    ``gpushare serve`` command line; ``start_timeout_s`` is how long they may take to
    come up; ``nri``: each node's runtime has NRI, and its agent registers there;
    ``api_timeout_s``: the cluster side's API request timeout."""
    async with FakeApiServer(token=API_TOKEN) as api_server:
        cluster = LoopbackCluster(
            api_server, root, make_pki(root / "pki"), api_timeout_s=api_timeout_s
        )
        cluster.agent_token = os.urandom(16).hex()
        make_token(root / "agent-token", cluster.agent_token)
        port = free_port("127.0.0.2")
        for index in range(nodes):
            cluster.add_node(index, port, agent_args, nri=nri)
        tasks: list[asyncio.Task[None]] = []
        stand_in: SchedulerStandIn | None = None
        cluster.kube = RestKubeApi.from_url(api_server.url, token=API_TOKEN)
        try:
            for node in cluster.nodes.values():
                await node.kubelet.start()
                if node.nri is not None:
                    await node.nri.start()
                node.start()
            await cluster.wait_agents(start_timeout_s)
            cluster.publish_endpoints()
            if cluster_side == "inline":
                side = await cluster.start_cluster_side()
                side.cache.set_targets({n.name: n.target for n in cluster.nodes.values()})
                await side.cache.wait_ready(20.0)
            elif cluster_side == "process":
                cluster.spawn_cluster_side()
                assert cluster.side_process is not None
                await wait_healthy(cluster.extender_url, cluster.side_process)
            cluster.kubelets = NodeKubelets(cluster.kube, api_server, cluster.nodes)
            tasks.append(asyncio.create_task(cluster.kubelets.run(), name="kubelets"))
            if scheduler and cluster_side in ("inline", "process"):
                stand_in = SchedulerStandIn(
                    api_server.url, cluster.extender_url, list(cluster.nodes), token=API_TOKEN
                )
                await stand_in.__aenter__()
                tasks.append(asyncio.create_task(stand_in.run(), name="scheduler"))
            yield cluster, stand_in
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if stand_in is not None:
                await stand_in.__aexit__(None, None, None)
            if cluster.kubelets is not None:
                await cluster.kubelets.aclose()
            await cluster.stop_cluster_side()
            if cluster.side_process is not None and cluster.side_process.poll() is None:
                cluster.side_process.kill()
                cluster.side_process.wait(timeout=30)
            for node in cluster.nodes.values():
                node.stop()
                await node.kubelet.stop()
                if node.nri is not None:
                    await node.nri.stop()
            await cluster.kube.aclose()
        for node in cluster.nodes.values():
            assert "Traceback" not in node.log_text(), node.log_text()[-4000:]
