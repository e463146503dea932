"""The composition root: reads like a wiring diagram of the agent.

``wiring.py`` constructs the adapters; this module starts them in order, serves until a stop
signal or a crashed core task, then stops everything in escalating steps within the grace
period. Nothing else constructs or starts adapters.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from agent.aio.tasks import Supervisor
from agent.api.collector import AgentCollector, TelemetryStats
from agent.api.dra_metrics import DraCollector
from agent.api.http import HttpServer, build_http_app
from agent.api.server import GrpcServer
from agent.claims.binding import BindingDecisions
from agent.claims.start import DraDriver, start_dra_driver
from agent.config import Settings, filewatch
from agent.control.loops import ControlLoops, build_control
from agent.core.snapshot import NodeSnapshot
from agent.core.types import Device
from agent.gpu.port import TelemetrySource
from agent.gpu.sampler import Sampler
from agent.learning.learned import adopt_learned
from agent.learning.learner import NodeLearning, start_learning
from agent.node.events import EventLog
from agent.node.service import NodeService
from agent.runtime import checks, effective, listeners, signals, snapshot
from agent.runtime.facade import NodeFacade
from agent.runtime.lock import InstanceLock
from agent.runtime.memory import tune_gc
from agent.runtime.notify import notify
from agent.runtime.reaper import become_subreaper, orphan_reaper
from agent.runtime.shutdown import ShutdownPlan, leases_ended, reap_children
from agent.runtime.wiring import (
    Ports,
    admission_rules,
    build_ports,
    connect_sim_counters,
    readiness_predictor,
    retention_gate,
    select_telemetry,
    standard_sizes,
)
from agent.state.port import Retention
from agent.state.sqlite import SqliteStateStore

if TYPE_CHECKING:  # the legacy path, fenced: imported when kubelet.enabled (see start)
    from agent.legacy.deviceplugin.start import KubeletPlugins

log = logging.getLogger(__name__)

__all__ = ["App", "Ports"]


class App:
    def __init__(
        self,
        settings: Settings,
        *,
        ports: Ports | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        tune_memory: bool = False,
    ) -> None:
        checks.check_settings(settings)
        self._tune_memory = tune_memory  # the process's GC settings: `gpushare serve` only
        self.settings = settings
        self.events = EventLog(clock=clock)
        self.ports = ports or build_ports(settings, self.events)
        self.store = self.ports.store or SqliteStateStore(
            settings.state_db_path, sync=settings.paths.state_sync
        )
        self.rules = admission_rules(settings)
        self.sizes = standard_sizes(settings)
        self.gate = retention_gate(settings)
        # a model learned on this node (RetrainEstimator) replaces estimator.model_dir
        self.learned = adopt_learned(self.gate, settings.paths.state_dir)
        self.readiness = readiness_predictor(settings)
        self.clock = clock
        self.monotonic = monotonic  # progress reports are timed by it
        self.devices: list[Device] = []
        self.node: NodeService | None = None
        self.control: ControlLoops | None = None
        self.learning: NodeLearning | None = None
        self.device_plugin: KubeletPlugins | None = None
        self.dra: DraDriver | None = None
        self.sampler: Sampler | None = None
        self.telemetry: TelemetrySource | None = None
        self.supervisor = Supervisor()
        self._fixed = snapshot.Fixed(
            settings.runtime.node_name,
            self.ports.simulated,
            clock,
            self.events,
            self.ports.mps.states,
            self.stale,
            self.estimates,
        )
        self.lock = InstanceLock(
            settings.unix_socket_path,
            state_dir=settings.paths.state_dir,
            mps_root=settings.mps_root_dir,
        )
        # before the files are read: a change from here on is seen by the first check
        self._secret_stamps = filewatch.stamps(listeners.secret_files(settings.api))
        self.servers = self._grpc_servers(settings)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(
            AgentCollector(
                self.snapshot,
                self._telemetry_stats,
                clock=clock,
                lease_memory=lambda: snapshot.lease_memory_used(self.control),
            )
        )
        self.http = None
        if settings.api.http_listen:
            app = build_http_app(registry=self.registry, readiness_problems=self.readiness_problems)
            self.http = HttpServer(app, listen=settings.api.http_listen)
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        self._started = self._stopping = False
        self._shutdown = ShutdownPlan(grace_s=settings.runtime.shutdown_grace_s)

    def _grpc_servers(self, settings: Settings) -> list[GrpcServer]:
        self.facade = facade = NodeFacade(
            self.snapshot,
            lambda: self.node,
            lambda: self.control.janitor if self.control else None,
            lambda: self.learning,
        )
        api = settings.api
        claims = BindingDecisions(
            lambda: self.dra.driver if self.dra else None, enabled=settings.dra.enabled
        )
        service = listeners.agent_service(facade, self.events, api.max_batch, claims)
        servers = [
            GrpcServer(
                service(admin=True),
                address=f"unix:{settings.unix_socket_path}",
                key="api.unix_socket",
            )
        ]
        if api.tcp_listen:
            servers.append(listeners.tcp_server(api, service))
        return servers

    @property
    def tcp_port(self) -> int | None:
        return self.servers[1].port if len(self.servers) > 1 else None

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit code 0) or a crashed core task (exit code 1)."""
        checks.prepare_runtime_dir(self.settings.paths.runtime_dir)
        Path(self.settings.unix_socket_path).parent.mkdir(parents=True, exist_ok=True)
        await self.lock.acquire_waiting(self.settings.runtime.lock_wait_s)
        failure: str | None = "start-up did not finish"
        try:
            signals.install(stop=self._on_signal, reload=self._on_reload)
            if await self._start_unless_stopped():
                failure = await self.supervisor.wait(self._stop)
            else:
                failure = None
        finally:
            try:
                await self._stop_everything()
            finally:
                self.lock.release()
                signals.remove()
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
        effective.publish(self.settings)  # logged, and kept for `gpushare config show`
        log.info("retention gate: %s; %d profile(s)", self.gate.name, len(self.gate.profiles))
        await self.ports.gpu.start()
        self.devices = await self.ports.gpu.list_devices()
        await self.store.start()
        await self.events.resume(self.store)
        self.supervisor.spawn("event-writer", self.events.writer())
        log.info(
            "node %s: %d device(s) on the %s backend%s; MPS control: %s",
            self.settings.runtime.node_name,
            len(self.devices),
            self.ports.gpu.name,
            " (simulated node)" if self.ports.simulated else "",
            self.ports.mps.backend,
        )
        if become_subreaper():
            self.supervisor.spawn("orphan-reaper", orphan_reaper())
        await self.ports.mps.start(self.devices)
        self.supervisor.spawn("mps-supervisor", self.ports.mps.run())
        await self._start_telemetry()
        await self._start_node()
        if self.http is not None:
            await self.http.start()
        for server in self.servers:
            await server.start()
        listeners.follow_secret_files(
            self.settings.api, self.servers, self.supervisor, self._secret_stamps
        )
        self._started = True
        if self._tune_memory:
            tune_gc()
        self.ready.set()
        notify(f"READY=1\nSTATUS=serving {len(self.devices)} device(s)\nMAINPID={os.getpid()}")
        log.info("agent ready (pid %d, socket %s)", os.getpid(), self.settings.unix_socket_path)

    async def _start_telemetry(self) -> None:
        self.telemetry = await select_telemetry(self.ports.telemetry, self.devices)
        t = self.settings.telemetry
        self.sampler = Sampler(
            self.telemetry,
            self.devices,
            interval_s=t.sample_interval_s,
            window_s=t.window_s,
            keep_windows=t.keep_windows,
            clock=self.clock,
        )
        await self.sampler.sample_once()
        self.supervisor.spawn("sampler", self.sampler.run())
        self.supervisor.spawn(
            "gpu-events", self.ports.gpu.watch_events(self._gpu_event), core=False
        )

    async def _start_node(self) -> None:
        self.node = NodeService(
            self.devices,
            store=self.store,
            events=self.events,
            rules=self.rules,
            sizes=self.sizes,
            mps_root=self.settings.mps_root_dir,
            mps_states=self.ports.mps.states,
            clock=self.clock,
            reservation_ttl_s=self.settings.admission.reservation_ttl_s,
            ready_deadline_s=self.settings.readiness.deadline_s,
            gate=self.gate,
            readiness=self.readiness,
            retention=Retention(
                ended_s=self.settings.admission.ended_retention_s,
                events_s=self.settings.admission.event_retention_s,
                max_events=self.settings.admission.max_events,
            ),
        )
        await self.node.load()
        mps = self.ports.mps
        if self.settings.kubelet.enabled:  # the legacy path: its fence is loaded only then
            from agent.legacy.deviceplugin.start import start_device_plugin

            self.device_plugin = await start_device_plugin(
                self.settings, self.node, self.events, store=self.store, clock=self.clock, shm=mps
            )
        self.dra = await start_dra_driver(
            self.settings,
            self.node,
            self.events,
            rules=self.rules,
            clock=self.clock,
            floor_of=self.gate.floor_of,
            shm=mps,
        )
        if self.dra is not None:
            self.dra.spawn(self.supervisor)
            self.registry.register(DraCollector(self.dra.stats))
        self.supervisor.spawn("reservation-reaper", self.node.reservation_reaper())
        self.supervisor.spawn("state-pruner", self.node.pruner())
        assert self.sampler is not None
        self.control = build_control(
            self.settings,
            self.node,
            gpu=self.ports.gpu,
            mps=self.ports.mps,
            events=self.events,
            gate=self.gate,
            sampler=self.sampler,
            clock=self.clock,
        )
        if self.dra is not None:  # a shared claim's processes: known by its pods' cgroups
            self.control.janitor.attributor.bound_now = self.dra.driver.bound_now
        self.control.spawn(self.supervisor)
        connect_sim_counters(self.telemetry, self.node, self.gate)
        self.learning = await start_learning(
            self.settings.estimator,
            state_dir=self.settings.paths.state_dir,
            store=self.store,
            gate=self.gate,
            events=self.events,
            ledger=self.node.ledger,
            devices=self.devices,
            sampler=self.sampler,
            supervisor=self.supervisor,
            clock=self.clock,
            monotonic=self.monotonic,
            learned=self.learned,
        )

    def _gpu_event(
        self, kind: str, message: str, device_uuid: str | None, attrs: Mapping[str, str]
    ) -> None:
        self.events(kind, message, device_uuid=device_uuid, attrs=attrs)

    async def _stop_everything(self) -> None:
        self._stopping = True
        mode, node = self.settings.runtime.on_stop, self.node
        if mode == "drain" and node is not None and not self._shutdown.overran:
            self.facade.closing = "the agent is stopping: draining its leases"
            left = await leases_ended(
                lambda: len(node.leases), timeout_s=self.settings.runtime.drain_timeout_s
            )
            log.info("drained: %d live lease(s) left", left)
        plan = self._shutdown
        plan.begin()
        notify("STOPPING=1")
        for server in self.servers:
            await plan.step("stop gRPC", server.stop(plan.share(0.2)))
        if self.http is not None:
            await plan.step("stop HTTP", self.http.stop())
        if self.device_plugin is not None:
            await plan.step("stop the device plugin", self.device_plugin.stop())
        if self.dra is not None:
            await plan.step("stop the DRA plugin", self.dra.stop())
        stuck = await self.supervisor.stop(timeout_s=plan.share(0.3))
        if stuck:
            log.warning("tasks still running after cancellation: %s", ", ".join(stuck))
        if self.dra is not None:
            await plan.step("close the DRA driver's API client", self.dra.aclose())
        keep = mode == "keep"
        kept = [s.pid for s in self.ports.mps.states() if keep and s.up and s.pid]
        await plan.step("stop MPS daemons", self.ports.mps.aclose(keep=keep))
        if self.telemetry is not None:
            await plan.step("close telemetry", self.telemetry.aclose())
        await plan.step("close GPU backend", self.ports.gpu.aclose())
        if self.store.writable():
            await plan.step("write the last events", self.events.flush_at_stop())
            if self.learning is not None:
                await plan.step(
                    "write the last run records", self.learning.recorder.flush_at_stop()
                )
        await plan.step("close the state store", self.store.aclose())
        await asyncio.to_thread(reap_children, timeout_s=max(plan.remaining(), 0.5), keep=kept)
        if plan.overran:
            log.warning("orderly stop incomplete: %s", ", ".join(plan.overran))

    # -- views -----------------------------------------------------------------------------

    def snapshot(self, *, ledger_only: bool = False) -> NodeSnapshot:
        live = snapshot.Live(
            self.devices,
            self.node,
            self.control,
            self.learning,
            self.sampler,
            self.telemetry,
            self._injector(),
        )
        return snapshot.take(self._fixed, live, ledger_only=ledger_only)

    def _injector(self) -> str:
        """How leases reach the node's containers: the device plugin (or NRI), or the DRA
        driver's CDI specs (saying so while the kubelet has not accepted its registration)."""
        if self.device_plugin is not None:
            return self.device_plugin.injector
        if self.dra is not None:
            registered = self.dra.server.registration.registered
            return "dra" if registered else "dra (not registered with the kubelet)"
        return ""

    def estimates(self) -> dict[str, float]:
        views = self.node.views() if self.node is not None else []
        return {k: v for view in views for k, v in self.gate.estimate(view).items()}

    def stale(self) -> list[str]:
        if self.sampler is None:
            return [d.uuid for d in self.devices]
        return self.sampler.stale_devices(stale_after_s=self.settings.telemetry.stale_after_s)

    def readiness_problems(self) -> list[str]:
        if self._stopping:
            return ["agent is stopping"]
        if not self._started:
            return ["agent is starting"]
        problems = [
            f"MPS daemon down on {m.device_uuid}: {m.detail or 'not answering'}"
            for m in self.ports.mps.states()
            if not m.up
        ]
        problems += [f"telemetry stale on {uuid}" for uuid in self.stale()]
        if not self.store.writable():
            problems.append(f"state store {self.settings.state_db_path} cannot write")
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

    def _on_reload(self) -> None:
        log.info("received SIGHUP: reloading the token and certificates")
        listeners.reload_secrets(self.servers)

    def _on_signal(self, signum: int) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        self.request_stop()
