"""A DRA cluster on loopback, every part real except those no machine here runs:

* the API server is the stand-in :class:`FakeApiServer` with the ``resource.k8s.io/v1``
  kinds (DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate);
* each node is a real ``gpushare serve --sim`` process with ``dra.enabled``: it publishes
  its slice to the API, serves its DRA kubelet plugin on Unix sockets in the node's own
  directories, and writes CDI specs there;
* each node's kubelet is a :class:`DraKubelet` (the kubelet's registration, Prepare,
  Unprepare and health over the real gRPC APIs, and the runtime's CDI injection into a
  fake container);
* :class:`DraSchedulerStandIn` plays the unmodified kube-scheduler (and the resourceclaim
  controller's claim creation);
* the binding answers come from the real :class:`BindingController` (``gpushare dra
  controller``) as an in-process task, asking each node's agent over its socket with the
  real gRPC client (:class:`AgentDecider`); :meth:`DraCluster.stop_controller` and
  :meth:`DraCluster.start_controller` take it down and bring it back;
* :class:`ClaimCleanup` plays the rest of the resourceclaim controller: a pod that is gone
  leaves its claims' ``reservedFor``, its generated claims are deleted and a claim
  reserved for nobody is deallocated;
* :class:`PodRunner` is the kubelet's pod worker: a pod bound to a node is run through that
  node's kubelet (Prepare, CDI), reported Running, and stopped (Unprepare) once deleted; the
  claim made for a pod's extended resources (KEP-5004) is run as one more of its claims. A
  pod it is told to hold waits, bound, until released (a kubelet that syncs it later).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient
from agent.dracontrol.agents import AgentDecider
from agent.dracontrol.controller import BindingController
from agent.dracontrol.port import Unreached
from agent.kubeapi.port import KubeError, NotFound, Obj
from agent.kubeapi.rest import RestKubeApi
from tests.agentproc import AgentProcess
from tests.certs import make_token
from tests.helpers import REPO, agent_command, subprocess_env
from tests.kubeworld.apiserver import ApiError, FakeApiServer
from tests.kubeworld.cluster.common import eventually as wait_until
from tests.kubeworld.cluster.common import node_settings, set_flags
from tests.kubeworld.kubelet import DraKubelet, FakeContainer, PodStartError
from tests.kubeworld.scheduler import DraSchedulerStandIn

API_TOKEN = "dra-api-token"
DRIVER = "gpushare.io"
# the DeviceClass as shipped
DEVICE_CLASS: Obj = yaml.safe_load((REPO / "deploy" / "dra" / "deviceclass.yaml").read_text())
RUN_RETRY_S = (0.2, 0.4, 0.8, 1.6, 3.2)  # the pod worker's backoff, shortened


async def eventually(predicate: Callable[[], Any], timeout_s: float = 30.0) -> None:
    """:func:`~tests.kubeworld.cluster.common.eventually`, with this path's longer wait."""
    await wait_until(predicate, timeout_s, poll_s=0.05)


@dataclass
class DraNode(AgentProcess):
    """One simulated GPU node: its agent process and its kubelet."""

    name: str
    root: Path
    api_url: str
    kubelet: DraKubelet
    settings: dict[str, Any] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    http_listen: str = ""  # the agent's /metrics listener (host:port); "": none

    @property
    def socket(self) -> Path:
        return self.root / "agent.sock"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def registry_dir(self) -> Path:
        return self.root / "registry"

    def spec_file(self, claim_uid: str) -> Path:
        """Where the driver writes the claim's CDI spec."""
        return self.cdi_dir / f"{DRIVER}-claim_{claim_uid}.json"

    def specs(self) -> dict[str, Any]:
        """Claim uid -> its CDI spec, parsed, for each spec of the driver on the node."""
        prefix, found = f"{DRIVER}-claim_", {}
        for path in sorted(self.cdi_dir.glob(f"{prefix}*.json")):
            with contextlib.suppress(FileNotFoundError):
                found[path.name[len(prefix) : -len(".json")]] = json.loads(path.read_text())
        return found

    def command(self) -> list[str]:
        settings = node_settings(
            self.root,
            **{
                "runtime.node_name": self.name,
                "dra.enabled": "true",
                "dra.plugin_dir": self.root / "plugins" / DRIVER,
                "dra.registry_dir": self.registry_dir,
                "dra.cdi_dir": self.cdi_dir,
                "dra.api_server": self.api_url,
                "dra.api_token_file": self.root / "api-token",
                "dra.reconcile_interval_s": 1.0,
                "dra.slice_min_interval_s": 0.2,
                **self.settings,
            },
        )
        sets = set_flags(settings)
        return agent_command(
            "--socket", str(self.socket), "serve", "--sim", "--http-listen", self.http_listen, *sets
        )

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        async with AgentClient(f"unix://{self.socket}", attempts=1) as client:
            return await getattr(client, method)(*args, **kwargs)

    async def cli(self, *args: str) -> str:
        """``gpushare --socket <agent> ARGS``, as an on-call engineer types it."""
        process = await asyncio.create_subprocess_exec(
            *agent_command("--socket", str(self.socket), *args),
            env=subprocess_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await process.communicate()
        assert process.returncode == 0, out.decode()
        return out.decode()

    async def leases(self) -> list[pb.Lease]:
        return list((await self.call("get_node")).leases)

    async def lease_ids(self) -> dict[str, list[str]]:
        """Claim uid -> the lease ids the ledger holds for it (request id ``dra:<uid>:...``)."""
        found: dict[str, list[str]] = {}
        for lease in await self.leases():
            found.setdefault(lease.request_id.split(":")[1], []).append(lease.lease_id)
        return found

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            while True:
                if self.process is not None and self.process.poll() is not None:
                    raise AssertionError(f"agent {self.name} exited:\n{self.log_text()[-3000:]}")
                with contextlib.suppress(Exception):
                    await self.call("get_node")
                    break
                await asyncio.sleep(0.1)
            await self.kubelet.wait_registered(DRIVER, timeout_s)


class PodRunner:
    """The kubelet's pod worker for pods bound to the nodes."""

    def __init__(self, api: RestKubeApi, server: FakeApiServer, nodes: Mapping[str, DraNode]):
        self.api = api
        self.server = server
        self.nodes = nodes
        self.containers: dict[tuple[str, str], dict[str, FakeContainer]] = {}
        self.errors: dict[tuple[str, str], str] = {}  # the last start failure of a pod
        self.stopped: dict[str, dict[str, str]] = {}  # pod uid -> Unprepare answers
        self.held: set[tuple[str, str]] = set()  # (namespace, name): not run until released
        self.waiting: dict[tuple[str, str], Obj] = {}  # held pods, bound to a node
        self._running: dict[str, Obj] = {}  # pod uid -> pod, on the node it was started on
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        bound = "spec.nodeName!="
        while True:
            with contextlib.suppress(KubeError, OSError):
                listing = await self.api.list_pods(field_selector=bound)
                for pod in listing.items:
                    self._see(pod, deleted=False)
                async for change in self.api.watch_pods(
                    listing.resource_version, field_selector=bound
                ):
                    self._see(change.obj, deleted=change.kind == "DELETED")
            await asyncio.sleep(0.1)

    def _see(self, pod: Obj, *, deleted: bool) -> None:
        meta = pod["metadata"]
        uid, key = meta["uid"], (meta["namespace"], meta["name"])
        if deleted or meta.get("deletionTimestamp"):
            self.waiting.pop(key, None)
            if uid in self._running:
                self._spawn(self._stop(self._running.pop(uid)))
            return
        if uid in self._running or pod["spec"].get("nodeName") not in self.nodes:
            return
        if key in self.held:
            self.waiting[key] = pod
            return
        self._running[uid] = pod
        self._spawn(self._start(pod))

    def release(self, namespace: str, name: str) -> None:
        """Run a held pod now (or as soon as it is bound)."""
        key = (namespace, name)
        self.held.discard(key)
        pod = self.waiting.pop(key, None)
        if pod is not None:
            self._see(pod, deleted=False)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        kubelet = self.nodes[pod["spec"]["nodeName"]].kubelet
        for wait_s in (*RUN_RETRY_S, None):
            if meta["uid"] not in self._running:
                return
            try:
                fresh = await self.api.get_pod(*key)
                self.containers[key] = await kubelet.run_pod(with_extended_claim(fresh))
                self.errors.pop(key, None)
                break
            except (PodStartError, KubeError) as exc:
                self.errors[key] = str(exc)
                if wait_s is None:
                    return
                await asyncio.sleep(wait_s)
        failed = [c.error for c in self.containers[key].values() if c.error]
        if failed:
            self.errors[key] = "; ".join(failed)
            return
        with contextlib.suppress(Exception):
            self.server.set_pod_phase(*key, "Running")

    async def _stop(self, pod: Obj) -> None:
        kubelet = self.nodes[pod["spec"]["nodeName"]].kubelet
        self.stopped[pod["metadata"]["uid"]] = await kubelet.stop_pod(pod)

    def env(self, namespace: str, pod: str, container: str = "main") -> dict[str, str]:
        return dict(self.containers[(namespace, pod)][container].env)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


EXTENDED_ENTRY = ":extended-resources"  # no pod claim entry can be named so (not a DNS label)


def with_extended_claim(pod: Obj) -> Obj:
    """The pod as a kubelet with DRAExtendedResource runs it: the claim the scheduler made
    for its extended resources (``status.extendedResourceClaimStatus``) is one more of its
    claims, each container using the requests mapped to it. A pod without one is returned
    as it is."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if not status or not status.get("resourceClaimName"):
        return pod
    spec = dict(pod["spec"])
    entry = {"name": EXTENDED_ENTRY, "resourceClaimName": status["resourceClaimName"]}
    spec["resourceClaims"] = [*(spec.get("resourceClaims") or []), entry]
    mapping = status.get("requestMapping") or []
    for part in ("initContainers", "containers"):
        if part in spec:
            spec[part] = [_with_requests(c, mapping) for c in spec[part]]
    return {**pod, "spec": spec}


def _with_requests(container: Obj, mapping: list[Obj]) -> Obj:
    mine = [
        {"name": EXTENDED_ENTRY, "request": m["requestName"]}
        for m in mapping
        if m.get("containerName") == container["name"]
    ]
    if not mine:
        return container
    resources = dict(container.get("resources") or {})
    resources["claims"] = [*(resources.get("claims") or []), *mine]
    return {**container, "resources": resources}


class ClaimCleanup:
    """The resourceclaim controller's part once a pod is gone: its claims no longer name
    it in ``reservedFor``; the claims generated for it are deleted; a claim reserved for
    nobody is deallocated."""

    def __init__(self, api: RestKubeApi, server: FakeApiServer) -> None:
        self.api = api
        self.server = server

    async def run(self) -> None:
        while True:
            with contextlib.suppress(KubeError, OSError):
                listing = await self.api.list_pods()
                async for change in self.api.watch_pods(listing.resource_version):
                    if change.kind == "DELETED":
                        await self.pod_gone(change.obj)
            await asyncio.sleep(0.1)

    async def pod_gone(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        for claim in await self._claims(pod["metadata"]["namespace"]):
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            owners = claim["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == uid for o in owners):
                with contextlib.suppress(ApiError):
                    self.server.delete_object(
                        "resourceclaims", claim["metadata"]["namespace"], claim["metadata"]["name"]
                    )
            elif any(r.get("uid") == uid for r in reserved):
                await self._unreserve(claim, uid)

    async def _claims(self, namespace: str) -> list[Obj]:
        return self.server.objects("resourceclaims", namespace)

    async def _unreserve(self, claim: Obj, pod_uid: str) -> None:
        status = dict(claim.get("status") or {})
        status["reservedFor"] = [
            r for r in status.get("reservedFor") or [] if r.get("uid") != pod_uid
        ]
        if not status["reservedFor"]:
            status = {}
        meta = claim["metadata"]
        with contextlib.suppress(NotFound):
            await self.api.replace_resource_claim_status(
                meta["namespace"], meta["name"], {**claim, "status": status}
            )


class NodeSockets:
    """Node -> its agent's Unix socket: the stand-in's agents listen on no TCP port, so no
    EndpointSlice names them (the real targets are tested in tests/dracontrol)."""

    def __init__(self, nodes: Mapping[str, DraNode]) -> None:
        self.nodes = nodes

    async def target(self, node: str) -> str:
        found = self.nodes.get(node)
        if found is None or found.process is None:
            raise Unreached(f"no agent on node {node}")
        return f"unix://{found.socket}"


def agent_link(target: str) -> AgentClient:
    return AgentClient(target, attempts=1, timeout_s=10.0)


@dataclass
class DraCluster:
    api_server: FakeApiServer
    root: Path
    kube: RestKubeApi
    nodes: dict[str, DraNode] = field(default_factory=dict)
    scheduler: DraSchedulerStandIn | None = None
    runner: PodRunner | None = None
    controller: BindingController | None = None
    _controlling: asyncio.Task[None] | None = None
    _decider: AgentDecider | None = None
    _controller_kube: RestKubeApi | None = None

    def start_controller(self, **options: Any) -> BindingController:
        """The binding-answer controller running (again: a fresh one, as a restarted
        process starts); ``options``: :class:`BindingController`'s own."""
        assert self._controlling is None, "the controller runs already"
        self._decider = AgentDecider(NodeSockets(self.nodes), agent_link)
        options = {"backoff_s": 0.2, "backoff_max_s": 1.0, "measure_bytes": True, **options}
        # a client of its own, on a token of its own: what the API sends it is counted apart
        self._controller_kube = RestKubeApi.from_url(
            self.api_server.url, token=self.api_server.client_token("controller")
        )
        self.controller = BindingController(self._controller_kube, self._decider, **options)
        self._controlling = asyncio.create_task(self.controller.run(), name="dra-controller")
        return self.controller

    async def stop_controller(self) -> None:
        """The controller gone (killed: nothing handed over); its counters stay readable."""
        task, self._controlling = self._controlling, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        decider, self._decider = self._decider, None
        if decider is not None:
            await decider.aclose()
        kube, self._controller_kube = self._controller_kube, None
        if kube is not None:
            await kube.aclose()

    def add_node(self, index: int, settings: Mapping[str, Any]) -> DraNode:
        name = f"gpu-node-{index}"
        root = self.root / f"n{index}"
        root.mkdir()
        # a token of its own: what the API sends each agent is counted for its node
        make_token(root / "api-token", self.api_server.client_token(name))
        kubelet = DraKubelet(
            root / "registry",
            node_name=name,
            api_url=self.api_server.url,
            token=API_TOKEN,
            cdi_dirs=(str(root / "cdi"),),
        )
        node = DraNode(name, root, self.api_server.url, kubelet, dict(settings))
        self.nodes[name] = node
        self.api_server.create_node(name)
        return node

    def slices(self, node: str | None = None) -> list[Obj]:
        found = self.api_server.objects("resourceslices")
        return [s for s in found if node is None or s["spec"]["nodeName"] == node]

    def claims(self) -> list[Obj]:
        return self.api_server.objects("resourceclaims")

    def claim_uid(self, pod: str) -> str:
        """The uid of the claim made for ``pod``'s ``gpu`` request from its template."""
        [found] = [c for c in self.claims() if c["metadata"]["name"].startswith(f"{pod}-gpu-")]
        return str(found["metadata"]["uid"])

    async def all_leases(self) -> dict[str, list[pb.Lease]]:
        return {name: await n.leases() for name, n in self.nodes.items() if n.process}

    async def apply(self, obj: Obj) -> Obj:
        """POST an object as ``kubectl apply`` would (pods through the API stand-in)."""
        return self.api_server.put_object(_resource_of(obj), obj)

    @property
    def running(self) -> PodRunner:
        assert self.runner is not None
        return self.runner


def _resource_of(obj: Obj) -> str:
    return {
        "Pod": "pods",
        "ResourceClaim": "resourceclaims",
        "ResourceClaimTemplate": "resourceclaimtemplates",
        "DeviceClass": "deviceclasses",
    }[obj["kind"]]


def claim_template(name: str, namespace: str = "default", **capacity: str) -> Obj:
    request: Obj = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    if capacity:
        request["exactly"]["capacity"] = {"requests": dict(capacity)}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def claim_pod(
    name: str, template: str, namespace: str = "default", *, run_as_user: int | None = 1000
) -> Obj:
    """A pod of one container using a claim from ``template``; it runs as ``run_as_user``
    (pod-level securityContext, as the chart's policy requires), None: not said."""
    security = {} if run_as_user is None else {"securityContext": {"runAsUser": run_as_user}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            **security,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "main", "image": "app", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


@contextlib.asynccontextmanager
async def dra_cluster(
    root: Path,
    nodes: int = 2,
    *,
    settings: Mapping[str, Any] | None = None,
    binding_timeout_s: float = 10.0,
    start_timeout_s: float = 90.0,
    controller: bool = True,
    http_listen: Callable[[str], str] | None = None,
) -> AsyncIterator[DraCluster]:
    """``nodes`` agents as DRA drivers, their kubelets, the scheduler stand-in, the pod
    worker, the claim cleanup and (unless ``controller`` is False) the binding-answer
    controller, all running; the DeviceClass created. ``http_listen``: node name -> the
    address of its agent's HTTP listener (/metrics); by default none listens."""
    async with FakeApiServer(token=API_TOKEN) as api_server:
        kube = RestKubeApi.from_url(api_server.url, token=API_TOKEN)
        cluster = DraCluster(api_server, root, kube)
        api_server.put_object("deviceclasses", DEVICE_CLASS)
        tasks: list[asyncio.Task[None]] = []
        for index in range(nodes):
            node = cluster.add_node(index, settings or {})
            if http_listen is not None:
                node.http_listen = http_listen(node.name)
        try:
            for node in cluster.nodes.values():
                await node.kubelet.start()
                node.start()
            for node in cluster.nodes.values():
                await node.wait_ready(start_timeout_s)
            await eventually(lambda: len(cluster.slices()) == nodes, start_timeout_s)
            cluster.scheduler = DraSchedulerStandIn(
                api_server.url, token=API_TOKEN, binding_timeout_s=binding_timeout_s
            )
            await cluster.scheduler.__aenter__()
            cluster.runner = PodRunner(kube, api_server, cluster.nodes)
            cleanup = ClaimCleanup(kube, api_server)
            for name, coro in (
                ("scheduler", cluster.scheduler.run()),
                ("pods", cluster.runner.run()),
                ("claims", cleanup.run()),
            ):
                tasks.append(asyncio.create_task(coro, name=name))
            if controller:
                cluster.start_controller()
            yield cluster
        finally:
            await cluster.stop_controller()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if cluster.runner is not None:
                await cluster.runner.aclose()
            if cluster.scheduler is not None:
                await cluster.scheduler.__aexit__(None, None, None)
            for node in cluster.nodes.values():
                node.stop()
                await node.kubelet.stop()
            await kube.aclose()
