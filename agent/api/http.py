"""HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness).

``/readyz`` answers 503 with a JSON list of reasons while any device's MPS daemon is
down, its telemetry is stale, or the state store cannot write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from agent.core.errors import GpushareError

log = logging.getLogger(__name__)


def build_http_app(
    *, registry: CollectorRegistry, readiness_problems: Callable[[], list[str]]
) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_request: web.Request) -> web.Response:
        problems = readiness_problems()
        if problems:
            return web.json_response({"status": "not ready", "problems": problems}, status=503)
        return web.json_response({"status": "ready"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


class HttpServer:
    """Runs the HTTP app on ``host:port`` (port 0 picks a free one; see ``port``)."""

    def __init__(self, app: web.Application, *, listen: str) -> None:
        self._app = app
        host, _, port = listen.rpartition(":")
        self._listen = listen
        self._host = host.strip("[]")
        self._port = int(port)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host or "127.0.0.1", self._port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise GpushareError(
                f"cannot serve HTTP on {self._listen}: {exc.strerror or exc} "
                "(change api.http_listen, or '' to disable)"
            ) from exc
        self._runner = runner
        server = site._server  # the bound asyncio server, to learn an ephemeral port
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._port
        log.info("HTTP serving /metrics /healthz /readyz on %s:%s", self._host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
