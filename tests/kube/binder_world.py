"""The world the binder's tests run in: real agents (the simulated node in this process,
over gRPC with a token), the stand-in API server over HTTP on loopback, the REST adapter
with a short timeout, and the extender's HTTP app with its binder; a :class:`World` to
create pods, bind them as the scheduler does and read back their placement and leases."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.client import AgentClient
from agent.kubeapi.rest import RestKubeApi
from agent.legacy.cluster.binder import Binder, BindOptions
from agent.legacy.cluster.cache import AgentCache
from agent.legacy.cluster.extender import Extender, build_extender_app
from agent.legacy.podleases import LEASE_ANNOTATION
from agent.runtime.app import App, Ports
from tests.certs import make_token
from tests.helpers import fake_ports, running_app, sim_settings
from tests.kubeworld.apiserver import FakeApiServer, Obj

NS = "team-a"
API_TOKEN = "api-" + "0b9c2d7e4f1a8c3b5d6e9f0a7b2c4d1e"
AGENT_TOKEN = "agent-" + "3c5e7a9b1d2f4e6a8c0b9d7f5e3a1c2b"
CLIENT_TIMEOUT_S = 1.0  # the REST adapter's: a hanging Binding is given up after this
BINDING = r"^/api/v1/namespaces/team-a/pods/{name}/binding$"
POD = r"^/api/v1/namespaces/team-a/pods/{name}$"


def ports() -> Ports:
    return fake_ports(2)


@dataclass
class World:
    server: FakeApiServer
    kube: RestKubeApi
    cache: AgentCache
    binder: Binder
    apps: dict[str, App]
    extender_url: str
    session: aiohttp.ClientSession
    answers: list[tuple[int, str]] = field(default_factory=list)

    def create(self, name: str, *, gang: str = "", size: int = 0) -> Obj:
        annotations = {"gpushare.io/memory": "4Gi", "gpushare.io/threads": "20"}
        if gang:
            annotations |= {"gpushare.io/gang": gang, "gpushare.io/gang-size": str(size)}
        return self.server.create_pod(
            name,
            NS,
            annotations=annotations,
            scheduler_name="gpushare",
            finalizers=["gpushare.io/lease"],
            limits={"gpushare.io/share": 1},
            run_as_user=1000,
        )

    def pod(self, name: str) -> Obj:
        found = self.server.pod(NS, name)
        assert found is not None
        return found

    def placement(self, name: str) -> tuple[str, str]:
        """(node, lease annotation) of the pod as the API server has it."""
        pod = self.pod(name)
        return pod["spec"].get("nodeName", ""), pod["metadata"].get("annotations", {}).get(
            LEASE_ANNOTATION, ""
        )

    async def bind(self, name: str, node: str) -> tuple[int, str]:
        """The scheduler's bind call to the extender: (HTTP status, its Error)."""
        args = {
            "PodName": name,
            "PodNamespace": NS,
            "PodUID": self.pod(name)["metadata"]["uid"],
            "Node": node,
        }
        async with self.session.post(f"{self.extender_url}/bind", json=args) as response:
            if response.status != 200:
                answer = (response.status, await response.text())
            else:
                answer = (200, str((await response.json())["Error"]))
        self.answers.append(answer)
        return answer

    async def leases(self) -> dict[str, tuple[str, pb.Lease]]:
        """Every live lease of every agent: lease id -> (node, lease)."""
        found: dict[str, tuple[str, pb.Lease]] = {}
        for node, app in self.apps.items():
            async with AgentClient(f"127.0.0.1:{app.tcp_port}", token=AGENT_TOKEN) as agent:
                for lease in (await agent.get_node()).leases:
                    found[lease.lease_id] = (node, lease)
        return found

    async def leases_of(self, name: str) -> list[tuple[str, pb.Lease]]:
        return [(n, x) for n, x in (await self.leases()).values() if x.pod == f"{NS}/{name}"]


@contextlib.asynccontextmanager
async def world(
    root: Path, nodes: tuple[str, ...] = ("n1",), **options: float
) -> AsyncIterator[World]:
    """Agents for ``nodes``, the stand-in API server, and the extender over HTTP, its binder
    reading pods from an informer that is always current (the stand-in's store)."""
    make_token(root / "agent-token", AGENT_TOKEN)
    bind = {"hold_s": 0.5, "gang_ttl_s": 5.0, "resolve_s": 3.0, **options}
    async with FakeApiServer(token=API_TOKEN) as server, contextlib.AsyncExitStack() as stack:
        apps = {}
        for node in nodes:
            (root / node).mkdir()
            settings = sim_settings(
                root / node,
                **{
                    "api.tcp_listen": "127.0.0.1:0",
                    "api.token_file": str(root / "agent-token"),
                    "api.insecure_loopback": True,
                    "estimator.model_dir": "none",
                },
            )
            apps[node] = await stack.enter_async_context(running_app(settings, ports()))
        kube = RestKubeApi.from_url(server.url, token=API_TOKEN, timeout_s=CLIENT_TIMEOUT_S)
        stack.push_async_callback(kube.aclose)
        cache = AgentCache(lambda target: AgentClient(target, token=AGENT_TOKEN, attempts=2))
        stack.push_async_callback(cache.aclose)
        cache.set_targets({n: f"127.0.0.1:{app.tcp_port}" for n, app in apps.items()})
        await cache.wait_ready(20.0)

        def informer(uid: str) -> Obj | None:
            pods = server.objects["pods"].values()
            return next((p for p in pods if p["metadata"]["uid"] == uid), None)

        binder = Binder(kube, cache, BindOptions(**bind), pods=informer)
        stack.push_async_callback(binder.aclose)
        runner = web.AppRunner(build_extender_app(Extender(cache, binder, Rules())))
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        session = await stack.enter_async_context(aiohttp.ClientSession())
        yield World(server, kube, cache, binder, apps, url, session)
