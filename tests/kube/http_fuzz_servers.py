"""The cluster side's HTTP endpoints as ``gpushare kube serve`` serves them, for the fuzz
and the tables of bad input: the extender (``/filter``, ``/prioritize``, ``/bind``,
``/healthz``) and the webhook (``/mutate``, ``/validate``, ``/healthz`` over HTTPS) in one
event loop on a thread of its own (:class:`ServerThread`), the extender deciding over one
node whose agent's answer is in its cache and binding through the real Kubernetes client
against the stand-in API server. A middleware measures each handler's CPU or its memory
(``time.thread_time``, ``tracemalloc``); :meth:`Servers.probing` probes ``/healthz`` from
another thread meanwhile. :func:`post` checks every answer and what it cost, and
:func:`check_log` the log (see tests/kube/test_http_fuzz.py)."""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from aiohttp import web

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.core.units import GIB
from agent.kubeapi.rest import RestKubeApi
from agent.legacy.cluster.agents import AgentLink
from agent.legacy.cluster.binder import Binder
from agent.legacy.cluster.cache import AgentCache, NodeEntry
from agent.legacy.cluster.extender import Extender, build_extender_app
from agent.legacy.cluster.webhook import build_webhook_app, tls_context
from tests.certs import make_pki
from tests.e2e.threaded_api import ServerThread
from tests.kubeworld.apiserver import FakeApiServer

NODE = "gpu-node-1"
NS = "team-a"
MAX_ANSWER_BYTES = 64 * 2**10
MAX_CPU_S = 0.100
MAX_PEAK_BYTES = 50 * 2**20
MAX_HEALTHZ_SERVER_S = 0.100
TIMEOUT_S = 20.0  # per request: an answer later than this is a hang
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- the servers -------------------------------------------------------------------------


def agent_answer() -> pb.GetNodeResponse:
    """One H100 with 20 GiB in use, as the agent's GetNode answers it."""
    uuid = "GPU-00000000-0000-0000-0000-000000000001"
    lease = pb.Lease(
        lease_id="l-1", request_id="r-1", tenant=NS, trust_domain=NS,
        device_uuid=uuid, priority="burstable", memory_bytes=20 * GIB, thread_pct=10,
        state="admitted", created_at=1.0, updated_at=1.0,
    )  # fmt: skip
    device = pb.Device(uuid=uuid, model="H100", memory_bytes=80 * GIB, sharing_mode="mps")
    return pb.GetNodeResponse(devices=[device], leases=[lease])


@dataclass
class Cost:
    path: str
    cpu_s: float
    peak_bytes: int


@dataclass
class Probe:
    status: int
    server_cpu_s: float
    wall_s: float
    counted: bool  # no traced request meanwhile


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Servers:
    """The extender and the webhook in one loop in one thread, as ``kube serve`` runs them
    (the thread: :class:`ServerThread`, started and stopped by ``running``)."""

    pki_dir: Path
    extender_port: int = 0
    webhook_port: int = 0
    costs: list[Cost] = field(default_factory=list)
    traced: int = 0  # requests traced so far; odd while one is (they come one at a time)
    log: Records = field(default_factory=Records)
    running: ServerThread = field(init=False)

    def __post_init__(self) -> None:
        self.running = ServerThread(self._serving, name="cluster-side")

    @asynccontextmanager
    async def _serving(self) -> AsyncIterator[None]:
        pki = make_pki(self.pki_dir)
        async with FakeApiServer() as api_server:
            api = RestKubeApi.from_url(api_server.url, timeout_s=10.0)
            cache = AgentCache(cast(Any, None))  # no agent is dialled: its answer is set here
            link = cast(AgentLink, object())
            cache.nodes[NODE] = NodeEntry(
                NODE, f"{NODE}:9807", link=link, snapshot=agent_answer(), error=""
            )
            extender = build_extender_app(Extender(cache, Binder(api, cache), Rules()))
            webhook = build_webhook_app()
            for app in (extender, webhook):
                app.middlewares.append(self._measured)
            runners = [web.AppRunner(app, access_log=None) for app in (extender, webhook)]
            try:
                for runner in runners:
                    await runner.setup()
                await web.TCPSite(runners[0], "127.0.0.1", 0).start()
                tls = tls_context(str(pki.server_cert), str(pki.server_key))
                await web.TCPSite(runners[1], "127.0.0.1", 0, ssl_context=tls).start()
                self.extender_port = runners[0].addresses[0][1]
                self.webhook_port = runners[1].addresses[0][1]
                yield
            finally:
                for runner in runners:
                    await runner.cleanup()
                await api.aclose()

    @web.middleware
    async def _measured(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The handler's CPU or (``X-Measure: memory``) its memory, the body read first
        (aiohttp keeps it for the handler's own read). /healthz is left out: it is what
        the prober measures."""
        if request.path == "/healthz":
            return await handler(request)
        await request.read()
        traced = request.headers.get("X-Measure") == "memory"
        if traced:
            self.traced += 1
            tracemalloc.start()
        cpu_s = time.thread_time()
        try:
            return await handler(request)
        finally:
            cpu_s = time.thread_time() - cpu_s
            if traced:
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                self.traced += 1
                self.costs.append(Cost(request.path, 0.0, peak))
            else:
                self.costs.append(Cost(request.path, cpu_s, 0))

    def client(self, path: str) -> Client:
        """A connection to the webhook (HTTPS, trusting the test CA) or to the extender."""
        host, timeout_s = "127.0.0.1", TIMEOUT_S
        if path not in ("/mutate", "/validate"):
            return Client(
                lambda: http.client.HTTPConnection(host, self.extender_port, timeout=timeout_s)
            )
        trust = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        return Client(
            lambda: http.client.HTTPSConnection(
                host, self.webhook_port, timeout=timeout_s, context=trust
            )
        )

    @contextmanager
    def probing(self) -> Iterator[list[Probe]]:
        """Probe the extender's /healthz from another thread while the block runs."""
        thread = self.running.thread
        assert thread is not None and thread.ident is not None
        clock = time.pthread_getcpuclockid(thread.ident)
        probes: list[Probe] = []
        done = threading.Event()

        def probe() -> None:
            client = self.client("/healthz")
            try:
                while not done.is_set():
                    traced = self.traced
                    cpu_s, wall_s = time.clock_gettime(clock), time.perf_counter()
                    status, _ = client.send("GET", "/healthz", b"")
                    cpu_s = time.clock_gettime(clock) - cpu_s
                    counted = traced % 2 == 0 and self.traced == traced
                    probes.append(Probe(status, cpu_s, time.perf_counter() - wall_s, counted))
                    done.wait(0.005)
            finally:
                client.close()

        prober = threading.Thread(target=probe, name="healthz-prober", daemon=True)
        prober.start()
        try:
            yield probes
        finally:
            done.set()
            prober.join(TIMEOUT_S + 5)
        assert not prober.is_alive(), "/healthz hung"
        assert all(p.status == 200 for p in probes), probes
        assert max(p.wall_s for p in probes) < TIMEOUT_S
        counted = [p for p in probes if p.counted]
        assert len(counted) >= 3, probes
        worst = max(counted, key=lambda p: p.server_cpu_s)
        assert worst.server_cpu_s <= MAX_HEALTHZ_SERVER_S, worst


class Client:
    """One keep-alive connection, opened again when the server closed it."""

    def __init__(self, connect: Callable[[], http.client.HTTPConnection]) -> None:
        self._connect = connect
        self._connection = connect()

    def send(self, method: str, path: str, body: bytes, measure: str = "cpu") -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                headers = {"Content-Type": "application/json", "X-Measure": measure}
                self._connection.request(method, path, body=body, headers=headers)
                answer = self._connection.getresponse()
                return answer.status, answer.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self.close()
                self._connection = self._connect()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._connection.close()


# -- well-formed bodies ------------------------------------------------------------------


def share_pod(**annotations: Any) -> dict[str, Any]:
    limits = {"gpushare.io/share": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-0",
            "namespace": NS,
            "uid": "6f1c1b0e-4c1a-4a52-9f7e-3d2a1b0c9e8f",
            "annotations": {
                "gpushare.io/memory": "20Gi",
                "gpushare.io/threads": "25",
                **annotations,
            },
        },
        "spec": {
            "schedulerName": "gpushare",
            "securityContext": {"runAsUser": 1000},
            "containers": [{"name": "train", "image": "train:1", "resources": {"limits": limits}}],
        },
    }


def review(pod: Any, *, operation: str = "CREATE", old: Any = None) -> dict[str, Any]:
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": NS,
        "operation": operation,
        "object": pod,
        "oldObject": old,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def binding(**fields: Any) -> dict[str, Any]:
    return {"PodName": "train-0", "PodNamespace": NS, "PodUID": "u-1", "Node": NODE, **fields}


def warm_up(served: Servers) -> None:
    """A first call of each kind (imports, the Kubernetes client's session) before any
    is measured."""
    for path, body in [
        ("/filter", {"pod": share_pod(), "nodenames": [NODE]}),
        ("/prioritize", {"pod": share_pod(), "nodenames": [NODE]}),
        ("/bind", binding()),
        ("/validate", review(share_pod())),
        ("/mutate", review(share_pod(**{"gpushare.io/sizing": "{mode: training}"}))),
    ]:
        client = served.client(path)
        status, answer = client.send("POST", path, json.dumps(body).encode())
        client.close()
        assert status == 200, (path, answer)
    served.costs.clear()


def post(served: Servers, client: Client, path: str, body: bytes) -> tuple[int, bytes]:
    """POST and check the answer and what it cost (see the module's text)."""
    measured = len(served.costs)
    status, answer = client.send("POST", path, body, "cpu")
    assert status < 500, (path, body[:300], answer[:300])
    assert len(answer) <= MAX_ANSWER_BYTES, (path, body[:300], len(answer))
    again, _ = client.send("POST", path, body, "memory")
    assert again == status, (path, body[:300], status, again)
    for cost in served.costs[measured:]:
        assert cost.cpu_s <= MAX_CPU_S, (cost, body[:300])
        assert cost.peak_bytes <= MAX_PEAK_BYTES, (cost, body[:300])
    return status, answer


def check_log(served: Servers) -> None:
    for record in served.log.records:
        message = record.getMessage()
        assert record.exc_info is None, f"a traceback in the log: {message}"
        assert record.levelno < logging.ERROR, message
        assert message.isprintable(), message
