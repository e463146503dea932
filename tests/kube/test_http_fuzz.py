"""Bad input to the cluster side's HTTP endpoints is a 4xx, never a 500: the webhook
(``/mutate``, ``/validate``, ``/healthz`` over HTTPS) and the extender (``/filter``,
``/prioritize``, ``/bind``, ``/healthz``), served as ``gpushare kube serve`` serves them (one
event loop, in its own thread here) and reached over real HTTP on loopback. The extender
decides over one node whose agent's answer is in its cache, and binds through the real
Kubernetes client against the stand-in API server.

First, tables of the malformed bodies seen answered 500. Then hypothesis sends JSON of any
shape (arrays, strings, deep nesting, huge numbers, Unicode), AdmissionReviews and extender
arguments with fields of any shape, and annotation text of any shape (YAML aliases
included), and checks every answer:

* its status is below 500, its body at most 64 KiB, and it came within the client's
  per-request timeout (no hang);
* the handler cost at most 100 ms of CPU and 50 MiB: measured in the server's thread around
  the handler, the body already read. Each body is sent twice: once timed with
  ``time.thread_time`` (the server thread's own CPU, so a loaded machine's other work does
  not count), once with ``tracemalloc`` tracing, for the peak of what the handler allocated
  (tracing slows allocation many times over, so the two are not measured together);
* the extender's ``/healthz``, probed from another thread all along, was answered each time
  within 100 ms of the server's time: the CPU the server thread spent between the probe's
  send and its answer (``time.pthread_getcpuclockid``), which is how long a handler
  could have kept the probe waiting (probes that overlapped a traced request, slowed by
  the tracing, are not counted). Wall time on a busy 2-core machine measures the machine,
  so it is only checked against the no-hang bound;
* nothing in the log is a traceback or an ERROR, and every log line is printable (no
  newline or control character forged by a caller's value).
"""

from __future__ import annotations

import asyncio
import gc
import http.client
import itertools
import json
import logging
import ssl
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.core.units import GIB
from agent.kubeapi.rest import RestKubeApi
from agent.legacy.cluster.agents import AgentLink
from agent.legacy.cluster.binder import Binder
from agent.legacy.cluster.cache import AgentCache, NodeEntry
from agent.legacy.cluster.extender import MAX_ARGS_BYTES, Extender, build_extender_app
from agent.legacy.cluster.webhook import build_webhook_app, tls_context
from tests.certs import make_pki
from tests.kubeworld.apiserver import FakeApiServer

NODE = "gpu-node-1"
NS = "team-a"
MAX_ANSWER_BYTES = 64 * 2**10
MAX_CPU_S = 0.100
MAX_PEAK_BYTES = 50 * 2**20
MAX_HEALTHZ_SERVER_S = 0.100
TIMEOUT_S = 20.0  # per request: an answer later than this is a hang
EXAMPLES = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
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
    """The extender and the webhook in one loop in one thread, as ``kube serve`` runs them."""

    pki_dir: Path
    extender_port: int = 0
    webhook_port: int = 0
    costs: list[Cost] = field(default_factory=list)
    traced: int = 0  # requests traced so far; odd while one is (they come one at a time)
    log: Records = field(default_factory=Records)
    thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _failure: BaseException | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="cluster-side", daemon=True)
        self.thread.start()
        assert self._ready.wait(30), "the servers did not start"
        assert self._failure is None, self._failure

    def stop(self) -> None:
        assert self._loop is not None and self._stop is not None and self.thread is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)
        assert self._failure is None, self._failure

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start() or stop()
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
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
                self._ready.set()
                await self._stop.wait()
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
        assert self.thread is not None and self.thread.ident is not None
        clock = time.pthread_getcpuclockid(self.thread.ident)
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


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Started once for the module. The objects the test process holds by then (every
    module a full test run imported) are frozen out of the garbage collector's passes: a
    full collection over them, run by whichever thread allocates at the moment, is not a
    handler's cost."""
    root = logging.getLogger()
    served = Servers(tmp_path_factory.mktemp("pki"))
    level = root.level
    root.addHandler(served.log)
    root.setLevel(logging.DEBUG)
    served.start()
    try:
        warm_up(served)
        gc.collect()
        gc.freeze()
        yield served
    finally:
        gc.unfreeze()
        served.stop()
        root.removeHandler(served.log)
        root.setLevel(level)


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


# -- the extender's malformed bodies -----------------------------------------------------

DEEP = b"[" * 50_000 + b"]" * 50_000  # within the values, past the depth
EXTENDER_MALFORMED: list[tuple[str, str, bytes | Any, str]] = [
    ("filter: an array", "/filter", [], "must be a JSON object"),
    ("filter: a string", "/filter", "ExtenderArgs", "must be a JSON object"),
    ("filter: a number", "/filter", 7, "must be a JSON object"),
    ("filter: 50,000 deep", "/filter", DEEP, "nested deeper than 64"),
    ("filter: objects 50,000 deep", "/filter", b'{"pod":' * 50_000 + b"1" + b"}" * 50_000,
     "nested deeper than 64"),
    ("filter: 100,001 values", "/filter", b"[" + b"0," * 100_000 + b"0]",
     "more than 100000 values"),
    ("filter: a number of 4,300 digits", "/filter", b'{"pod": ' + b"9" * 4300 + b"}",
     "more than 100 digits"),
    ("filter: not JSON", "/filter", b'{"pod": ', "not JSON"),
    ("filter: not UTF-8", "/filter", b'{"pod": "\xc3\x28"}', "not UTF-8"),
    ("filter: pod a string", "/filter", {"pod": "train-0", "nodenames": [NODE]}, "pod"),
    ("filter: pod a list", "/filter", {"pod": [share_pod()], "nodenames": [NODE]}, "pod"),
    ("filter: nodenames a number", "/filter", {"pod": share_pod(), "nodenames": 3}, "nodenames"),
    ("filter: nodenames an object", "/filter", {"pod": share_pod(), "nodenames": {"a": 1}},
     "nodenames"),
    ("filter: a node name a number", "/filter", {"pod": share_pod(), "nodenames": [NODE, 7]},
     "nodenames[1]"),
    ("filter: a node name with a newline", "/filter", {"pod": share_pod(), "nodenames": [
        "gpu-node-1\nforged"]}, "nodenames[0]"),
    ("filter: a node name too long", "/filter", {"pod": share_pod(), "nodenames": [
        "n" * 300]}, "nodenames[0]"),
    ("filter: nodes a list", "/filter", {"pod": share_pod(), "nodes": [NODE]}, "nodes"),
    ("filter: nodes.items not a list", "/filter", {"pod": share_pod(), "nodes": {"items": 5}},
     "nodes.items"),
    ("filter: an item not an object", "/filter", {"pod": share_pod(), "nodes": {"items": [
        NODE]}}, "nodes.items[0]"),
    ("filter: an item's metadata a list", "/filter", {"pod": share_pod(), "nodes": {"items": [
        {"metadata": []}]}}, "nodes.items[0]"),
    ("prioritize: an array", "/prioritize", [share_pod()], "must be a JSON object"),
    ("prioritize: 50,000 deep", "/prioritize", DEEP, "nested deeper than 64"),
    ("prioritize: pod a string", "/prioritize", {"pod": "x", "nodenames": [NODE]}, "pod"),
    ("prioritize: nodenames a number", "/prioritize", {"pod": share_pod(), "nodenames": 1e9},
     "nodenames"),
    ("bind: an array", "/bind", [binding()], "must be a JSON object"),
    ("bind: a string", "/bind", "train-0", "must be a JSON object"),
    ("bind: 50,000 deep", "/bind", DEEP, "nested deeper than 64"),
    ("bind: no PodUID", "/bind", {k: v for k, v in binding().items() if k != "PodUID"},
     "PodUID"),
    ("bind: PodName a list", "/bind", binding(PodName=["train-0"]), "PodName"),
    ("bind: PodName an object 10,000 deep", "/bind", json.dumps(binding(PodName=0)).replace(
        "0", '{"a":' * 60 + "0" + "}" * 60).encode(), "PodName"),
    ("bind: Node with a newline", "/bind", binding(Node="gpu-node-1\nINFO forged"), "Node"),
    ("bind: namespace with capitals", "/bind", binding(PodNamespace="Team-A"), "PodNamespace"),
    ("bind: a uid of a megabyte", "/bind", binding(PodUID="u" * 2**20), "PodUID"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [m[1:] for m in EXTENDER_MALFORMED],
    ids=[m[0] for m in EXTENDER_MALFORMED],
)
def test_malformed_extender_bodies_are_400(
    servers: Servers, path: str, body: bytes | Any, reason: str
) -> None:
    servers.log.records.clear()
    client = servers.client(path)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, answer = post(servers, client, path, data)
    finally:
        client.close()
    assert status == 400, answer[:300]
    assert reason in answer.decode(), answer[:300]
    assert len(answer) < 1000, answer[:300]  # says what is wrong, never repeats the body
    check_log(servers)


def test_the_extenders_size_limit(servers: Servers) -> None:
    """A body of MAX_ARGS_BYTES is read (and costs what any request may); one byte more is
    413, before anything is parsed."""
    args = json.dumps({"pod": share_pod(), "nodenames": [NODE]}).encode()
    client = servers.client("/filter")
    try:
        largest = args + b" " * (MAX_ARGS_BYTES - len(args))
        status, answer = post(servers, client, "/filter", largest)
        assert status == 200, answer[:300]
        assert json.loads(answer)["nodenames"] == [NODE]
        status, answer = client.send("POST", "/filter", largest + b" ")
        assert status == 413, answer[:300]
    finally:
        client.close()


WELL_FORMED: list[tuple[str, str, Any, Callable[[Any], bool]]] = [
    ("filter", "/filter", {"pod": share_pod(), "nodenames": [NODE, "gpu-node-2"]},
     lambda a: a["nodenames"] == [NODE] and "gpu-node-2" in a["failedNodes"]),
    ("filter with nodes", "/filter", {"pod": share_pod(), "nodes": {"items": [
        {"metadata": {"name": NODE}}]}}, lambda a: a["nodenames"] == [NODE]),
    ("filter without nodes", "/filter", {"pod": share_pod()}, lambda a: a["nodenames"] == []),
    ("filter, a bad ask", "/filter", {"pod": share_pod(**{"gpushare.io/threads": "\uff12\uff15"}),
                                      "nodenames": [NODE]},
     lambda a: a["failedAndUnresolvableNodes"][NODE].startswith("gpushare.io/threads")),
    ("filter, a pod with no metadata", "/filter", {"pod": {"spec": 1}, "nodenames": [NODE]},
     lambda a: a["nodenames"] == []),
    ("filter, a uid that is a number", "/filter", {"pod": {**share_pod(), "metadata": {
        **share_pod()["metadata"], "uid": 7}}, "nodenames": [NODE]},
     lambda a: a["nodenames"] == [NODE]),
    ("prioritize", "/prioritize", {"pod": share_pod(), "nodenames": [NODE]},
     lambda a: a[0]["Host"] == NODE and a[0]["Score"] > 0),
    ("prioritize, a uid that is an object", "/prioritize", {"pod": {**share_pod(), "metadata": {
        **share_pod()["metadata"], "uid": {"a": 1}}}, "nodenames": [NODE]},
     lambda a: a[0]["Host"] == NODE),
    ("bind of a pod that is gone", "/bind", binding(PodName="gone-0"),
     lambda a: a["Error"] == f"pod {NS}/gone-0 is gone"),
    ("bind in lower case", "/bind", {k.lower(): v for k, v in binding().items()},
     lambda a: a["Error"].endswith("is gone")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "expected"), [w[1:] for w in WELL_FORMED], ids=[w[0] for w in WELL_FORMED]
)
def test_well_formed_extender_bodies_are_answered(
    servers: Servers, path: str, body: Any, expected: Callable[[Any], bool]
) -> None:
    client = servers.client(path)
    try:
        status, answer = post(servers, client, path, json.dumps(body).encode())
    finally:
        client.close()
    assert status == 200, answer[:300]
    assert expected(json.loads(answer)), answer[:300]


# -- the fuzz ----------------------------------------------------------------------------

POSTS = ("/filter", "/prioritize", "/bind", "/mutate", "/validate")
KEYS = (
    "pod", "nodenames", "nodes", "items", "metadata", "name", "namespace", "uid",
    "annotations", "spec", "containers", "initContainers", "ephemeralContainers", "env",
    "envFrom", "prefix", "value", "securityContext", "capabilities", "add", "privileged",
    "resources", "limits", "requests", "gpushare.io/share", "hostIPC", "hostPID",
    "PodName", "PodNamespace", "PodUID", "Node", "apiVersion", "kind", "request", "object",
    "oldObject", "operation", "subResource", "resource", "volumes", "hostPath", "path",
)  # fmt: skip
TEXTS = (
    "", "Pod", "pods", "CREATE", "UPDATE", "ephemeralcontainers", "status", NODE, NS,
    "admission.k8s.io/v1", "AdmissionReview", "gpushare", "20Gi", "\u0662\u0660Gi",
    "\uff12\uff15", "1e999", "9" * 1000, "a\nb", "\x1b[2J", "\u202e", "/run/gpushare",
    "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_", "SYS_ADMIN", "SYS_PTRACE", "ALL",
)  # fmt: skip
ANNOTATIONS = (
    "gpushare.io/memory", "gpushare.io/sizing", "gpushare.io/threads", "gpushare.io/priority",
    "gpushare.io/gang", "gpushare.io/gang-size", "gpushare.io/lease", "gpushare.io/node-agent",
)  # fmt: skip
YAML_TOKENS = (
    "{", "}", "[", "]", ",", ": ", "\n", "- ", "? ", "&a ", "&b ", "*a", "*b", "<<: ", "!!int ",
    "!!float ", "!!timestamp ", "!!binary ", "!!set ", "!!python/name:os.system ", "---\n",
    "parameters", "mode", "training", "inference", "dtype", "layers", "7e9", "1", "0x1F",
    "1:30", ".inf", "\u0667", "\uff17", "9" * 300, '"', "'", "#", "%YAML 1.1\n", "|\n  ",
)  # fmt: skip


def json_values(max_leaves: int = 25) -> st.SearchStrategy[Any]:
    leaves = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.integers(min_value=10**30, max_value=10**1000)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=40)
        | st.sampled_from(TEXTS)
    )
    keys = st.sampled_from(KEYS) | st.text(max_size=12)
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
        max_leaves=max_leaves,
    )


def alias_bombs() -> st.SearchStrategy[str]:
    """Each of up to nine levels up to nine aliases of the one below (9**10 leaves)."""

    def bomb(levels: int, fanout: int, wrap: bool) -> str:
        names = [f"l{i}" for i in range(levels + 1)]
        parts = [f"&{names[0]} [" + ",".join(["x"] * fanout) + "]"]
        for below, name in itertools.pairwise(names):
            parts.append(f"&{name} [" + ",".join([f"*{below}"] * fanout) + "]")
        body = "[" + ", ".join(parts) + "]"
        return "{mode: training, parameters: " + body + "}" if wrap else body

    uniform = st.sampled_from(range(1, 10))  # hypothesis draws small integers most often
    return st.builds(bomb, uniform, uniform, st.booleans())


ODD_NUMBERS = (
    "9" * 1000, "1e999", "-1", "0x" + "f" * 900, "1:" * 300 + "1", "\u0667e9", "!!int x",
    "!!float y", ".nan", "!!binary AA==",
)  # fmt: skip
ODD_YAML = (
    "!!timestamp 2024-13-45", "{mode: !!set {a}}", "? [a]\n: b", "\x1f", "!!int",
    "{mode: training, parameters: 7e9}\n---\n{}", "%TAG ! x\n--- !a b", "{<<: {a: 1}}",
)  # fmt: skip


def sizing_text() -> st.SearchStrategy[str]:
    """``gpushare.io/sizing`` values: YAML of any shape, aliases and bad tags included."""
    depth = st.sampled_from([1, 2, 3, 100, 340, 500, 1000]) | st.integers(1, 1100)
    field = st.sampled_from(["parameters", "mode", "layers", "dtype", "kv_heads"])
    value = st.sampled_from(ODD_NUMBERS) | json_values(5).map(json.dumps)
    return st.one_of(
        alias_bombs(),
        depth.map(lambda n: "[" * n + "]" * n),
        depth.map(lambda n: "{a: " * n + "1" + "}" * n),
        st.lists(st.sampled_from(YAML_TOKENS), max_size=40).map("".join),
        st.builds("{{mode: training, {}: {}}}".format, field, value),
        st.sampled_from(ODD_YAML),
        st.text(max_size=80),
    )


QUANTITY = (  # Kubernetes' grammar, with other scripts' digits among the ASCII ones
    r"\A[+-]?[0-9\u0660-\u0669\uff10-\uff19.]{0,70}([eE][0-9]{0,4})?"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|GiB|GB|b)?\Z"
)


def annotation_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=80), sizing_text(), st.from_regex(QUANTITY), st.sampled_from(TEXTS)
    )


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object with any of ``fields``."""
    return st.fixed_dictionaries({}, optional=fields)


def run_as_user() -> st.SearchStrategy[Any]:
    """UIDs, the edges of their range and beyond it, and any JSON."""
    edges = st.sampled_from([0, 1000, 4294967294, 4294967295, -1, 2**63, True, "1000"])
    return edges | st.integers() | json_values(2)


def containers() -> st.SearchStrategy[Any]:
    env = st.fixed_dictionaries(
        {"name": st.sampled_from(TEXTS) | st.text(max_size=30) | json_values(3)},
        optional={"value": json_values(3), "valueFrom": json_values(3)},
    )
    share = st.sampled_from(["1", 1, "2", 0]) | json_values(3)
    capabilities = st.lists(st.sampled_from(TEXTS) | json_values(2), max_size=4)
    container = st.fixed_dictionaries(
        {"name": st.text(max_size=10)},
        optional={
            "resources": optional(limits=st.fixed_dictionaries({"gpushare.io/share": share})),
            "env": st.lists(env, max_size=4) | json_values(3),
            "envFrom": st.lists(st.fixed_dictionaries({"prefix": json_values(2)}), max_size=2),
            "securityContext": optional(
                privileged=json_values(2),
                capabilities=st.fixed_dictionaries({"add": capabilities}),
                runAsUser=run_as_user(),
            ),
        },
    )
    return st.lists(container, max_size=3) | json_values(5)


def pods() -> st.SearchStrategy[Any]:
    annotations = st.dictionaries(
        st.sampled_from(ANNOTATIONS), annotation_text() | json_values(3), max_size=6
    )
    metadata = optional(
        name=st.text(max_size=60) | json_values(3),
        namespace=st.sampled_from([NS, ""]) | json_values(2),
        uid=st.sampled_from(["u-1"]) | json_values(2),
        annotations=annotations | json_values(5),
        finalizers=json_values(3),
    )
    path = json_values(2) | st.sampled_from(["/", "/run/gpushare", "/var/lib"])
    volume = st.fixed_dictionaries({"hostPath": st.fixed_dictionaries({"path": path})})
    spec = optional(
        containers=containers(),
        initContainers=containers(),
        ephemeralContainers=containers(),
        schedulerName=st.sampled_from(["gpushare", "default-scheduler"]) | json_values(2),
        nodeName=json_values(2),
        hostIPC=json_values(1),
        hostPID=json_values(1),
        hostNetwork=json_values(1),
        volumes=st.lists(volume, max_size=3),
        securityContext=optional(runAsUser=run_as_user()),
    )
    pod = st.fixed_dictionaries(
        {"metadata": metadata, "spec": spec}, optional={"kind": st.just("Pod")}
    )
    return pod | json_values(8)


def reviews() -> st.SearchStrategy[Any]:
    operations = st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])
    kinds = st.sampled_from([{"group": "", "version": "v1", "kind": "Pod"}, {}])
    resources = st.just({"group": "", "version": "v1", "resource": "pods"})
    sub_resources = st.sampled_from(["", "ephemeralcontainers", "status"])
    request = st.fixed_dictionaries(
        {
            "uid": st.just("r-1") | json_values(2),
            "operation": operations | json_values(1),
            "object": pods(),
        },
        optional={
            "kind": kinds | json_values(2),
            "resource": resources | json_values(2),
            "subResource": sub_resources | json_values(1),
            "namespace": st.just(NS) | json_values(1),
            "oldObject": pods(),
        },
    )
    return st.fixed_dictionaries(
        {
            "apiVersion": st.just("admission.k8s.io/v1"),
            "kind": st.just("AdmissionReview"),
            "request": request,
        }
    )


def extender_args() -> st.SearchStrategy[Any]:
    names = st.lists(st.sampled_from([NODE, "gpu-node-2"]) | st.text(max_size=20), max_size=8)
    item = st.fixed_dictionaries(
        {"metadata": st.fixed_dictionaries({"name": st.just(NODE) | json_values(1)})}
    )
    nodes = st.fixed_dictionaries({"items": st.lists(item, max_size=3)})
    filter_args = optional(
        pod=pods(), nodenames=names | json_values(3), nodes=nodes | json_values(3)
    )
    name = st.sampled_from([NODE, NS, "train-0", "u-1"]) | json_values(2)
    bind_args = optional(PodName=name, PodNamespace=name, PodUID=name, Node=name)
    return filter_args | bind_args


def raw_bodies() -> st.SearchStrategy[bytes]:
    nesting = st.integers(1, 200_000).flatmap(
        lambda n: st.sampled_from([b"[" * n + b"]" * n, b"[" * n, b'{"a":' * n + b"1" + b"}" * n])
    )
    return st.one_of(
        st.binary(max_size=300),
        nesting,
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.text(max_size=50).map(lambda t: json.dumps(t).encode("utf-16")),
        st.integers(1, 20_000).map(lambda n: b"[" + b"1," * n + b"1]"),
    )


@contextmanager
def clients(served: Servers) -> Iterator[dict[str, Client]]:
    made = {path: served.client(path) for path in POSTS}
    try:
        yield made
    finally:
        for client in made.values():
            client.close()


@pytest.mark.timeout(300)
def test_fuzz_json_of_any_shape(servers: Servers) -> None:
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:

        @EXAMPLES
        @given(path=st.sampled_from(POSTS), body=json_values(40))
        def send(path: str, body: Any) -> None:
            post(servers, by_path[path], path, json.dumps(body).encode())

        send()
    check_log(servers)


@pytest.mark.timeout(300)
def test_fuzz_raw_bodies(servers: Servers) -> None:
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:

        @EXAMPLES
        @given(path=st.sampled_from(POSTS), body=raw_bodies())
        def send(path: str, body: bytes) -> None:
            status, _ = post(servers, by_path[path], path, body)
            assert status == 400 or body.strip().startswith(b"{"), (status, body[:100])

        send()
    check_log(servers)


@pytest.mark.timeout(300)
def test_fuzz_admission_reviews(servers: Servers) -> None:
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:

        @EXAMPLES
        @given(path=st.sampled_from(["/mutate", "/validate"]), body=reviews())
        def send(path: str, body: Any) -> None:
            status, answer = post(servers, by_path[path], path, json.dumps(body).encode())
            if status == 200:  # an answer: allowed, or refused with a 400 or 403 and why
                response = json.loads(answer)["response"]
                assert response["allowed"] or response["status"]["code"] in (400, 403)

        send()
    check_log(servers)


@pytest.mark.timeout(300)
def test_fuzz_extender_arguments(servers: Servers) -> None:
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:

        @EXAMPLES
        @given(path=st.sampled_from(["/filter", "/prioritize", "/bind"]), body=extender_args())
        def send(path: str, body: Any) -> None:
            post(servers, by_path[path], path, json.dumps(body).encode())

        send()
    check_log(servers)


@pytest.mark.timeout(300)
def test_fuzz_annotations(servers: Servers) -> None:
    """Annotation text of any shape, in a pod that is otherwise well formed, to the webhook
    and to the extender's filter (which reads the same annotations)."""
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:
        sizing = st.tuples(st.just("gpushare.io/sizing"), sizing_text())
        other = st.tuples(st.sampled_from(ANNOTATIONS[:6]), annotation_text())

        @EXAMPLES
        @given(annotation=sizing | other, path=st.sampled_from(["/filter", "/validate", "/mutate"]))
        def send(annotation: tuple[str, str], path: str) -> None:
            name, text = annotation
            pod = share_pod(**{name: text})
            if name == "gpushare.io/sizing":
                del pod["metadata"]["annotations"]["gpushare.io/memory"]
            body = review(pod) if path != "/filter" else {"pod": pod, "nodenames": [NODE]}
            status, answer = post(servers, by_path[path], path, json.dumps(body).encode())
            assert status == 200, answer[:300]

        send()
    check_log(servers)
