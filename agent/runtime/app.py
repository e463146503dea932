"""The one composition root: reads like a wiring diagram of the agent.

Only this module constructs adapters. ``App.run`` starts everything in order, waits for a
stop signal or a crashed core task, then stops everything in escalating steps within the
configured grace period.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent.api.collector import AgentCollector, TelemetryStats
from agent.api.grpc_server import AgentService, GrpcServer
from agent.api.http import HttpServer, build_http_app
from agent.config import Settings, settings_as_dict
from agent.core.errors import GpushareError
from agent.core.types import Device, NodeSnapshot
from agent.gpu.exporter import ExporterTelemetry
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.gpu.port import GpuBackend, TelemetrySource
from agent.gpu.sampler import Sampler
from agent.mps.control import SubprocessMpsControl
from agent.mps.manager import SupervisedMpsManager
from agent.mps.port import ControlChannel, MpsManager
from agent.mps.supervisor import DaemonDefaults, SupervisorOptions
from agent.runtime import checks
from agent.runtime.events import EventLog
from agent.runtime.lock import InstanceLock
from agent.runtime.reaper import become_subreaper, orphan_reaper
from agent.runtime.shutdown import ShutdownPlan, reap_children
from agent.runtime.tasks import Supervisor
from agent.sim.contention import device_counters

log = logging.getLogger(__name__)


@dataclass
class Ports:
    """The hardware-facing collaborators; tests and the simulated node pass fakes."""

    gpu: GpuBackend
    mps: MpsManager
    telemetry: list[TelemetrySource]  # candidates, in order of preference
    simulated: bool


def build_ports(settings: Settings, events: EventLog) -> Ports:
    if settings.sim.enabled:
        spec = checks.load_sim_spec(settings.sim.node_file)
        gpu: GpuBackend = FakeGpuBackend(spec.devices)
    else:
        from agent.gpu.nvml import NvmlGpuBackend

        gpu = NvmlGpuBackend()
    return Ports(
        gpu=gpu,
        mps=build_mps_manager(settings, gpu, events),
        telemetry=build_telemetry(settings),
        simulated=settings.sim.enabled,
    )


def build_telemetry(settings: Settings) -> list[TelemetrySource]:
    """The counter sources to try, best first (see telemetry.source)."""
    t = settings.telemetry
    choice = t.source
    if choice == "auto":
        choice = "sim" if settings.sim.enabled else "dcgm,exporter,nvml"
    sources: list[TelemetrySource] = []
    for name in choice.split(","):
        if name == "sim":
            sources.append(FakeTelemetrySource(sim_counters))
        elif name == "dcgm":
            from agent.gpu.dcgm import DcgmTelemetry

            sources.append(DcgmTelemetry(hostname=t.dcgm_host, interval_s=t.sample_interval_s))
        elif name == "exporter":
            sources.append(ExporterTelemetry(t.exporter_url, timeout_s=t.exporter_timeout_s))
        elif name == "nvml":
            from agent.gpu.nvml_counters import NvmlTelemetry

            sources.append(NvmlTelemetry())
    return sources


def sim_counters(_device: Device, _now: float) -> dict[str, float]:
    """Counters of a simulated device from the contention model of what runs on it.
    Nothing is placed on simulated devices yet, so they read as idle."""
    return device_counters([])


def build_mps_manager(settings: Settings, gpu: GpuBackend, events: EventLog) -> MpsManager:
    m = settings.mps
    options = SupervisorOptions(
        binary=checks.resolve_control_binary(settings),
        root_dir=settings.mps_root_dir,
        probe_interval_s=m.probe_interval_s,
        hung_after_probes=m.hung_after_probes,
        start_timeout_s=m.start_timeout_s,
        backoff_initial_s=m.restart_backoff_initial_s,
        backoff_max_s=m.restart_backoff_max_s,
        quit_timeout_s=m.quit_timeout_s,
        client_gid=m.client_gid,
        multi_user=m.multi_user,
    )
    defaults = DaemonDefaults(m.default_thread_pct, checks.memory_limit_bytes(settings))

    def channel(_device: Device, env: Mapping[str, str]) -> ControlChannel:
        return SubprocessMpsControl(options.binary, env, timeout_s=m.command_timeout_s)

    async def set_exclusive(device: Device, exclusive: bool) -> None:
        await gpu.set_compute_mode(device, exclusive=exclusive)

    return SupervisedMpsManager(
        options,
        lambda _device: defaults,
        channel_factory=channel,
        emit=events,
        set_exclusive=set_exclusive,
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
        checks.check_settings(settings)
        self.settings = settings
        self.events = EventLog(clock=clock)
        self.ports = ports or build_ports(settings, self.events)
        self._clock = clock
        self._state = _Running()
        self.supervisor = Supervisor()
        self.lock = InstanceLock(settings.unix_socket_path)
        self.sampler: Sampler | None = None
        self.telemetry: TelemetrySource | None = None
        self.grpc = GrpcServer(
            AgentService(self.snapshot),
            unix_socket=settings.unix_socket_path,
            tcp_listen=settings.api.tcp_listen,
        )
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(AgentCollector(self.snapshot, self._telemetry_stats, clock=clock))
        self.http = None
        if settings.api.http_listen:
            app = build_http_app(registry=self.registry, readiness_problems=self.readiness_problems)
            self.http = HttpServer(app, listen=settings.api.http_listen)
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        self._shutdown = ShutdownPlan(grace_s=settings.runtime.shutdown_grace_s)

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit code 0) or a crashed core task (exit code 1)."""
        checks.prepare_runtime_dir(self.settings.paths.runtime_dir)
        Path(self.settings.unix_socket_path).parent.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        failure: str | None = "start-up did not finish"
        try:
            self._install_signal_handlers()
            if await self._start_unless_stopped():
                failure = await self.supervisor.wait(self._stop)
            else:
                failure = None
        finally:
            try:
                await self._stop_everything()
            finally:
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

    async def _start_unless_stopped(self) -> bool:
        """Start; a stop request during start-up cancels it. True if the agent came up."""
        start = asyncio.create_task(self._start(), name="start-up")
        stop = asyncio.create_task(self._stop.wait(), name="start-up-stop-wait")
        await asyncio.wait([start, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not start.done():
            log.warning("stop requested during start-up: abandoning it")
            start.cancel()
        await asyncio.gather(stop, return_exceptions=True)
        try:
            await start
        except asyncio.CancelledError:
            if not self._stop.is_set():
                raise
            return False
        return True

    async def _start(self) -> None:
        log.info("effective configuration: %s", settings_as_dict(self.settings))
        await self.ports.gpu.start()
        devices = await self.ports.gpu.list_devices()
        self._state.devices = devices
        log.info(
            "node %s: %d device(s) on the %s backend%s; MPS control: %s",
            self.settings.runtime.node_name,
            len(devices),
            self.ports.gpu.name,
            " (simulated node)" if self.ports.simulated else "",
            self.ports.mps.backend,
        )
        if become_subreaper():
            self.supervisor.spawn("orphan-reaper", orphan_reaper())
        await self.ports.mps.start(devices)
        self.supervisor.spawn("mps-supervisor", self.ports.mps.run())
        self.telemetry = await self._select_telemetry(devices)
        t = self.settings.telemetry
        self.sampler = Sampler(
            self.telemetry,
            devices,
            interval_s=t.sample_interval_s,
            window_s=t.window_s,
            keep_windows=t.keep_windows,
            clock=self._clock,
        )
        await self.sampler.sample_once()
        self.supervisor.spawn("sampler", self.sampler.run())
        self.supervisor.spawn(
            "gpu-events", self.ports.gpu.watch_events(self._gpu_event), core=False
        )
        if self.http is not None:
            await self.http.start()
        await self.grpc.start()
        self._state.started = True
        self.ready.set()
        log.info("agent ready (pid %d, socket %s)", os.getpid(), self.settings.unix_socket_path)

    async def _select_telemetry(self, devices: list[Device]) -> TelemetrySource:
        """The first candidate that starts and reads; else the last one, to recover later."""
        skipped = []
        candidates = self.ports.telemetry
        for source in candidates:
            try:
                await source.start()
                await source.read(devices)
            except GpushareError as exc:
                skipped.append(f"{source.name}: {exc}")
                if source is not candidates[-1]:
                    await source.aclose()
                    continue
                log.warning("telemetry source %s does not answer yet: %s", source.name, exc)
            log.info(
                "telemetry source: %s%s",
                source.name,
                f" (skipped {'; '.join(skipped)})" if skipped else "",
            )
            return source
        raise GpushareError("no telemetry source is configured")

    def _gpu_event(
        self, kind: str, message: str, device_uuid: str | None, attrs: Mapping[str, str]
    ) -> None:
        self.events(kind, message, device_uuid=device_uuid, attrs=attrs)

    async def _stop_everything(self) -> None:
        self._state.stopping = True
        plan = self._shutdown
        plan.begin()
        await plan.step("stop gRPC", self.grpc.stop(plan.share(0.3)))
        if self.http is not None:
            await plan.step("stop HTTP", self.http.stop())
        stuck = await self.supervisor.stop(timeout_s=plan.share(0.3))
        if stuck:
            log.warning("tasks still running after cancellation: %s", ", ".join(stuck))
        await plan.step("stop MPS daemons", self.ports.mps.aclose())
        if self.telemetry is not None:
            await plan.step("close telemetry", self.telemetry.aclose())
        await plan.step("close GPU backend", self.ports.gpu.aclose())
        await asyncio.to_thread(reap_children, timeout_s=max(plan.remaining(), 0.5))
        if plan.overran:
            log.warning("orderly stop incomplete: %s", ", ".join(plan.overran))

    # -- views -----------------------------------------------------------------------------

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(
            node_name=self.settings.runtime.node_name,
            simulated=self.ports.simulated,
            taken_at=self._clock(),
            devices=tuple(self._state.devices),
            mps=tuple(self.ports.mps.states()),
            latest_samples=tuple(self.sampler.latest() if self.sampler else ()),
            latest_windows=tuple(self.sampler.latest_windows() if self.sampler else ()),
            telemetry_source=self.telemetry.name if self.telemetry else "",
            stale_devices=tuple(self._stale()),
        )

    def _stale(self) -> list[str]:
        if self.sampler is None:
            return [d.uuid for d in self._state.devices]
        return self.sampler.stale_devices(stale_after_s=self.settings.telemetry.stale_after_s)

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
        problems += [f"telemetry stale on {uuid}" for uuid in self._stale()]
        return problems

    def _telemetry_stats(self) -> TelemetryStats:
        if self.sampler is None:
            return TelemetryStats("none", 0, 0, up=False)
        return TelemetryStats(
            self.sampler.source_name,
            self.sampler.samples_total,
            self.sampler.errors_total,
            up=self.sampler.up,
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
