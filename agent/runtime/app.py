"""The one composition root: reads like a wiring diagram of the agent.

Only this module constructs adapters. ``App.run`` starts everything in order, waits for a
stop signal or a crashed core task, then stops everything in escalating steps within the
configured grace period.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent.api.collector import AgentCollector, TelemetryStats
from agent.api.grpc_server import AgentService, GrpcServer
from agent.api.http import HttpServer, build_http_app
from agent.config import Settings, settings_as_dict
from agent.core.errors import ConfigError, GpuUnavailableError
from agent.core.types import Device, NodeSnapshot
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.gpu.port import GpuBackend, TelemetrySource
from agent.gpu.sampler import Sampler
from agent.mps.fake import FakeMpsManager
from agent.mps.port import MpsManager
from agent.runtime.lock import InstanceLock
from agent.runtime.shutdown import ShutdownPlan, reap_children
from agent.runtime.tasks import Supervisor
from agent.sim.node import SimNodeSpec, parse_sim_node

log = logging.getLogger(__name__)


@dataclass
class Ports:
    """The hardware-facing collaborators; tests and the simulated node pass fakes."""

    gpu: GpuBackend
    mps: MpsManager
    telemetry: TelemetrySource
    simulated: bool


def build_ports(settings: Settings) -> Ports:
    if settings.sim.enabled:
        spec = load_sim_spec(settings.sim.node_file)
        return Ports(
            gpu=FakeGpuBackend(spec.devices),
            mps=FakeMpsManager(default_thread_pct=settings.mps.default_thread_pct),
            telemetry=FakeTelemetrySource(),
            simulated=True,
        )
    from agent.gpu.nvml import NvmlGpuBackend

    # Real nodes: NVML is probed at start; App._start refuses to go further until the MPS
    # supervisor and NVML telemetry exist, so these two fakes are never started.
    return Ports(
        gpu=NvmlGpuBackend(),
        mps=FakeMpsManager(),
        telemetry=FakeTelemetrySource(),
        simulated=False,
    )


def load_sim_spec(node_file: str) -> SimNodeSpec:
    if not node_file:
        return SimNodeSpec.default()
    try:
        text = Path(node_file).read_text()
    except OSError as exc:
        raise ConfigError("sim.node_file", f"cannot read {node_file}: {exc.strerror}") from exc
    return parse_sim_node(text, source=node_file)


def check_tcp_listen(listen: str) -> None:
    """Until the scheduler listener is authenticated it may bind to loopback only."""
    if not listen:
        return
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit():
        raise ConfigError("api.tcp_listen", f"must be host:port (got {listen!r})")
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback:
        raise ConfigError(
            "api.tcp_listen",
            "the TCP listener has no authentication in this version; bind it to 127.0.0.1",
        )


@dataclass
class _Running:
    devices: list[Device] = field(default_factory=list)
    started: bool = False
    stopping: bool = False


class App:
    def __init__(
        self,
        settings: Settings,
        *,
        ports: Ports | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_tcp_listen(settings.api.tcp_listen)
        self.settings = settings
        self.ports = ports or build_ports(settings)
        self._clock = clock
        self._state = _Running()
        self.supervisor = Supervisor()
        self.lock = InstanceLock(settings.unix_socket_path)
        self.sampler: Sampler | None = None
        self.grpc = GrpcServer(
            AgentService(self.snapshot),
            unix_socket=settings.unix_socket_path,
            tcp_listen=settings.api.tcp_listen,
        )
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(AgentCollector(self.snapshot, self._telemetry_stats, clock=clock))
        self.http = (
            HttpServer(
                build_http_app(registry=self.registry, readiness_problems=self.readiness_problems),
                listen=settings.api.http_listen,
            )
            if settings.api.http_listen
            else None
        )
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        self._shutdown = ShutdownPlan(grace_s=settings.runtime.shutdown_grace_s)

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit code 0) or a crashed core task (exit code 1)."""
        self._install_signal_handlers()
        Path(self.settings.unix_socket_path).parent.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        failure: str | None = "start-up did not finish"
        try:
            await self._start()
            failure = await self.supervisor.wait(self._stop)
        finally:
            await self._stop_everything()
            self.lock.release()
            self._remove_signal_handlers()
        if failure is not None:
            log.error("agent stopped because %s", failure)
            return 1
        log.info("agent stopped cleanly")
        return 0

    def request_stop(self) -> None:
        if self._stop.is_set():
            log.warning("second stop request: skipping the orderly steps")
            self._shutdown.force()
        self._stop.set()

    async def _start(self) -> None:
        log.info("effective configuration: %s", settings_as_dict(self.settings))
        await self.ports.gpu.start()
        devices = await self.ports.gpu.list_devices()
        if not self.ports.simulated:
            raise GpuUnavailableError(
                f"found {len(devices)} GPU(s) through NVML, but this version of the agent "
                "manages simulated nodes only: MPS supervision and NVML telemetry for real "
                "GPUs are not built yet. Run: gpushare serve --sim"
            )
        self._state.devices = devices
        log.info(
            "node %s: %d device(s) on the %s backend%s",
            self.settings.runtime.node_name,
            len(devices),
            self.ports.gpu.name,
            " (simulated node)" if self.ports.simulated else "",
        )
        await self.ports.mps.start(devices)
        await self.ports.telemetry.start()
        self.sampler = Sampler(
            self.ports.telemetry,
            devices,
            interval_s=self.settings.telemetry.sample_interval_s,
            clock=self._clock,
        )
        await self.sampler.sample_once()
        self.supervisor.spawn("sampler", self.sampler.run())
        await self.grpc.start()
        if self.http is not None:
            await self.http.start()
        self._state.started = True
        self.ready.set()
        log.info("agent ready (pid %d, socket %s)", os.getpid(), self.settings.unix_socket_path)

    async def _stop_everything(self) -> None:
        self._state.stopping = True
        plan = self._shutdown
        plan.begin()
        await plan.step("stop gRPC", self.grpc.stop(plan.share(0.3)))
        if self.http is not None:
            await plan.step("stop HTTP", self.http.stop())
        stuck = await self.supervisor.stop(timeout_s=plan.share(0.5))
        if stuck:
            log.warning("tasks still running after cancellation: %s", ", ".join(stuck))
        await plan.step("stop MPS daemons", self.ports.mps.aclose())
        await plan.step("close telemetry", self.ports.telemetry.aclose())
        await plan.step("close GPU backend", self.ports.gpu.aclose())
        await asyncio.to_thread(reap_children, timeout_s=max(plan.remaining(), 0.5))

    # -- views -----------------------------------------------------------------------------

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(
            node_name=self.settings.runtime.node_name,
            simulated=self.ports.simulated,
            taken_at=self._clock(),
            devices=tuple(self._state.devices),
            mps=tuple(self.ports.mps.states()),
            latest_samples=tuple(self.sampler.latest() if self.sampler else ()),
        )

    def readiness_problems(self) -> list[str]:
        if self._state.stopping:
            return ["agent is stopping"]
        if not self._state.started or self.sampler is None:
            return ["agent is starting"]
        problems = [
            f"MPS daemon down on {m.device_uuid}: {m.detail or 'not answering'}"
            for m in self.ports.mps.states()
            if not m.up
        ]
        stale = self.sampler.stale_devices(stale_after_s=self.settings.telemetry.stale_after_s)
        problems += [f"telemetry stale on {uuid}" for uuid in stale]
        return problems

    def _telemetry_stats(self) -> TelemetryStats:
        if self.sampler is None:
            return TelemetryStats(self.ports.telemetry.name, 0, 0)
        return TelemetryStats(
            self.sampler.source_name, self.sampler.samples_total, self.sampler.errors_total
        )

    # -- signals ---------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)

    def _remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        self.request_stop()
