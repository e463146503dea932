"""``gpushare dra controller``'s HTTP listener (``--http-listen``): ``/healthz`` (liveness),
``/readyz`` (readiness), as :mod:`agent.dracontrol.health` decides them, and ``/metrics``
(Prometheus: the controller's counters, the claims owed, whether it leads, the follow
loop's idle time, the agents' open channels). Served on the controller's event loop, so
an answer at all says the loop runs; the HTTP server is the agent's own
(:class:`agent.api.http.HttpServer`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from agent.api.http import HttpServer
from agent.core.errors import ConfigError, GpushareError
from agent.dracontrol.controller import BindingController

PREFIX = "gpushare_dra_controller"
COUNTER_HELP = {  # one per field of controller.Counters
    "claims_seen": "ResourceClaim objects decoded (listed, or in a watch event).",
    "events_skipped": "Watch events passed undecoded (claims not of the driver).",
    "bytes_decoded": "Bytes of claim JSON decoded, when measured.",
    "relists": "Lists of the claims begun from their first page.",
    "list_pages": "Pages of claim lists read.",
    "follow_failures": "Lists and watches of the claims that failed (then backed off).",
    "asks": "AnswerClaim calls to the nodes' agents.",
    "unreached": "AnswerClaim calls that got no answer (the claim stays owed).",
    "answers_written": "Shares whose answer landed in a status write.",
    "refusals_written": "Shares whose refusal landed in a status write.",
    "write_failures": "Status writes that failed (other than 409 and 404).",
}


class ControllerCollector(Collector):
    """The controller's state at each scrape (nothing kept between scrapes)."""

    def __init__(
        self, controller: BindingController, linked: Callable[[], int] = lambda: 0
    ) -> None:
        self._controller = controller
        self._linked = linked

    def collect(self) -> Iterator[Metric]:
        controller, counters = self._controller, self._controller.counters
        for name, text in COUNTER_HELP.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", text, value=getattr(counters, name))
        progress = controller.progress
        gauges = {
            "owed_claims": ("Claims whose binding answer is owed now.", controller.owing),
            "leading": (
                "1 while this replica works (leads, or runs unelected).",
                progress.following,
            ),
            "idle_seconds": ("Seconds since the follow loop's last step.", progress.idle_s),
            "agent_channels": ("Open gRPC channels to the nodes' agents.", self._linked()),
            "nodes_asked": (
                "Nodes with an AnswerClaim waiting or running.",
                len(controller.node_slots),
            ),
        }
        for name, (text, value) in gauges.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", text, value=float(value))


def probe_app(controller: BindingController, registry: CollectorRegistry) -> web.Application:
    progress = controller.progress

    async def healthz(_request: web.Request) -> web.Response:
        problems = progress.liveness_problems()
        if problems:
            return web.json_response({"status": "unhealthy", "problems": problems}, status=503)
        return web.json_response({"status": "ok", "role": progress.role})

    async def readyz(_request: web.Request) -> web.Response:
        problems = progress.readiness_problems()
        if problems:
            body = {"status": "not ready", "role": progress.role, "problems": problems}
            return web.json_response(body, status=503)
        return web.json_response({"status": "ready", "role": progress.role})

    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


class ProbeServer:
    """The listener on ``listen`` (``host:port``; port 0 picks one: see :attr:`port`)."""

    def __init__(
        self, controller: BindingController, *, listen: str, linked: Callable[[], int] = lambda: 0
    ) -> None:
        registry = CollectorRegistry(auto_describe=True)
        registry.register(ControllerCollector(controller, linked))
        self._listen = listen
        self._server = HttpServer(probe_app(controller, registry), listen=listen)

    @property
    def port(self) -> int | None:
        return self._server.port

    async def start(self) -> None:
        try:
            await self._server.start()
        except GpushareError as exc:  # its message names the agent's setting: name ours
            raise ConfigError(
                "--http-listen", f"cannot serve on {self._listen}: {exc.__cause__}"
            ) from exc

    async def stop(self) -> None:
        await self._server.stop()
