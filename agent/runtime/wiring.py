"""Construction of the adapters: the composition root's wiring diagram (with ``app.py``).

Nothing else in the agent constructs an adapter. Constructors here do no I/O; the App
starts and stops what is built.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.admission.capacity import StandardSize
from agent.admission.policy import Placement, Rules
from agent.config import Settings
from agent.config.fields import setting_bytes
from agent.core.errors import ConfigError, GpushareError, ValidationError
from agent.core.lease import Lease, LeaseState
from agent.core.types import Device
from agent.gpu.exporter import ExporterTelemetry
from agent.gpu.fake import FakeTelemetrySource
from agent.gpu.port import GpuBackend, TelemetrySource
from agent.learning.gate import ProfileGate
from agent.learning.profiler import Profiler
from agent.mps.control import SubprocessMpsControl
from agent.mps.manager import SupervisedMpsManager
from agent.mps.options import DaemonDefaults, SupervisorOptions
from agent.mps.port import ControlChannel, MpsManager
from agent.mps.shmstate import ShmOptions
from agent.node.events import EventLog
from agent.node.service import NodeService, ReadinessPredictor
from agent.runtime import checks
from agent.sim.contention import Load, device_counters
from agent.sim.processes import SimGpuBackend
from agent.state.sqlite import SqliteStateStore

log = logging.getLogger(__name__)


@dataclass
class Ports:
    """The hardware-facing collaborators; tests and the simulated node pass fakes."""

    gpu: GpuBackend
    mps: MpsManager
    telemetry: list[TelemetrySource]  # candidates, in order of preference
    simulated: bool
    # None: the SQLite store at settings.state_db_path. The SQLite store, for it is also the
    # legacy device plugin's (AllocationStore, beside the StateStore port).
    store: SqliteStateStore | None = None


def build_gpu(settings: Settings) -> GpuBackend:
    """The simulated node's devices on --sim, else NVML's."""
    if settings.sim.enabled:
        return SimGpuBackend(checks.load_sim_spec(settings.sim.node_file).devices)
    from agent.gpu.nvml import NvmlGpuBackend

    return NvmlGpuBackend()


def build_ports(settings: Settings, events: EventLog) -> Ports:
    gpu = build_gpu(settings)
    mps = build_mps_manager(settings, gpu, events)
    if isinstance(gpu, SimGpuBackend):  # the simulated NVML lists the daemons' clients
        gpu.mps_states = mps.states
    return Ports(
        gpu=gpu,
        mps=mps,
        telemetry=build_telemetry(settings),
        simulated=settings.sim.enabled,
        store=SqliteStateStore(settings.state_db_path, sync=settings.paths.state_sync),
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
            sources.append(FakeTelemetrySource(SimCounters()))
        elif name == "dcgm":
            from agent.gpu.dcgm import DcgmTelemetry

            sources.append(DcgmTelemetry(hostname=t.dcgm_host, interval_s=t.sample_interval_s))
        elif name == "exporter":
            sources.append(ExporterTelemetry(t.exporter_url, timeout_s=t.exporter_timeout_s))
        elif name == "nvml":
            from agent.gpu.nvml_counters import NvmlTelemetry

            sources.append(NvmlTelemetry())
    return sources


class SimCounters:
    """Counters of a simulated device: the contention model over the leases it holds, each
    with its solo signature (inline counters, its profile's, or the gate's default). With
    nothing placed the device is idle. The App connects ``leases`` and ``signature``."""

    def __init__(self) -> None:
        self.leases: Callable[[str], list[Lease]] = lambda _uuid: []
        self.signature: Callable[[Lease], Mapping[str, float]] = lambda _lease: {}
        # Injected misbehaviour: lease id -> the counters it really runs with.
        self.behaviour: dict[str, Mapping[str, float]] = {}

    def __call__(self, device: Device, _now: float) -> dict[str, float]:
        loads = [
            Load(
                self.behaviour.get(x.lease_id) or self.signature(x),
                thread_pct=x.thread_pct,
                memory_bytes=x.memory_bytes,
                name=x.lease_id,
            )
            for x in self.leases(device.uuid)
            if x.state is not LeaseState.RESERVED
        ]
        return device_counters(loads)


def supervisor_options(settings: Settings) -> SupervisorOptions:
    """How the node's MPS daemons are run: by the agent, and by ``gpushare mps host``."""
    m = settings.mps
    return SupervisorOptions(
        binary=checks.resolve_control_binary(settings),
        root_dir=settings.mps_root_dir,
        probe_interval_s=m.probe_interval_s,
        hung_after_probes=m.hung_after_probes,
        start_timeout_s=m.start_timeout_s,
        backoff_initial_s=m.restart_backoff_initial_s,
        backoff_max_s=m.restart_backoff_max_s,
        quit_timeout_s=m.quit_timeout_s,
        client_gid=m.client_gid,
        client_group=m.client_group,
        multi_user=m.multi_user,
        by_host=m.launch == "host",
        shm=ShmOptions.of(m),
    )


def build_mps_manager(settings: Settings, gpu: GpuBackend, events: EventLog) -> MpsManager:
    m = settings.mps
    options = supervisor_options(settings)
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
        driver_version=gpu.driver_version,
    )


def admission_rules(settings: Settings) -> Rules:
    a = settings.admission
    return Rules(
        reserve_bytes=setting_bytes("admission.memory_reserve", a.memory_reserve),
        context_overhead_bytes=setting_bytes("admission.context_overhead", a.context_overhead),
        thread_budget_pct=a.thread_budget_pct,
        guaranteed_budget_pct=a.guaranteed_budget_pct,
        max_clients=a.max_clients,
        placement=Placement(a.placement),
        # legacy MPS runs one server per UID; a multi-user daemon serves several at once
        one_user_per_device=not settings.mps.multi_user,
    )


def standard_sizes(settings: Settings) -> list[StandardSize]:
    key = "admission.standard_sizes"
    sizes = []
    for item in settings.admission.standard_sizes.split(","):
        memory, sep, threads = item.strip().partition("/")
        try:
            sizes.append(StandardSize(setting_bytes(key, memory), float(threads)))
        except ValueError:
            raise ConfigError(
                key, f"each size is MEMORY/THREADS, e.g. 10GiB/12.5 ({item!r})"
            ) from None
        if not sep:
            raise ConfigError(
                key, f"each size is MEMORY/THREADS, e.g. 10GiB/12.5 ({item!r})"
            ) from None
    return sizes


def retention_gate(settings: Settings) -> ProfileGate:
    """The admission's retention gate: the configured model (or none) and the profiles."""
    from agent.estimator.model import DEFAULT_MODEL_DIR, RetentionModel
    from agent.estimator.profiles import load_profiles

    e = settings.estimator
    try:
        profiles = load_profiles(Path(e.profiles_dir))
        model = None
        if e.model_dir != "none":
            model = RetentionModel.load(
                DEFAULT_MODEL_DIR if e.model_dir == "default" else Path(e.model_dir)
            )
    except ValidationError as exc:
        raise ConfigError(
            "estimator.model_dir" if "model" in str(exc.field) else "estimator.profiles_dir",
            str(exc),
        ) from exc
    return ProfileGate(model, profiles, coverage=e.coverage, gate_precision=e.gate_precision)


def readiness_predictor(settings: Settings) -> ReadinessPredictor | None:
    """P(ready) for AdmitBatch ordering: the configured readiness model, or none."""
    from agent.estimator.readiness import DEFAULT_READINESS_DIR, ReadinessModel

    where = settings.readiness.model_dir
    if where == "none":
        return None
    try:
        model = ReadinessModel.load(DEFAULT_READINESS_DIR if where == "default" else Path(where))
    except ValidationError as exc:
        raise ConfigError("readiness.model_dir", str(exc)) from exc
    return lambda rows: [float(p) for p in model.predict(rows)]


async def start_profiler(
    settings: Settings, *, device_index: int, duration_s: float, warmup_s: float, events: EventLog
) -> tuple[Profiler, Callable[[], Any]]:
    """A Profiler on one device with its own MPS daemon (under ``<runtime_dir>/profile-mps``),
    and the coroutine function that stops everything it started."""
    ports = build_ports(settings, events)
    await ports.gpu.start()
    devices = {d.index: d for d in await ports.gpu.list_devices() if d.parent_uuid is None}
    if device_index not in devices:
        await ports.gpu.aclose()
        raise ConfigError("--device", f"no whole GPU with index {device_index} on this node")
    device = devices[device_index]
    profile_settings = dataclasses.replace(
        settings,
        mps=dataclasses.replace(
            settings.mps, root_dir=f"{settings.paths.runtime_dir}/profile-mps", shm_root=""
        ),  # the profiler's clients run on the host: the host's /dev/shm
    )
    manager = build_mps_manager(profile_settings, ports.gpu, events)
    assert isinstance(manager, SupervisedMpsManager)
    await manager.start([device])
    supervisor = manager.supervisor(device.uuid)
    telemetry = ports.telemetry[-1]  # the last candidate: NVML on a GPU node (always there)
    await telemetry.start()

    async def stop() -> None:
        await manager.aclose()
        await telemetry.aclose()
        await ports.gpu.aclose()

    profiler = Profiler(device, supervisor, telemetry, duration_s=duration_s, warmup_s=warmup_s)
    return profiler, stop


async def select_telemetry(
    candidates: Sequence[TelemetrySource], devices: list[Device]
) -> TelemetrySource:
    """The first candidate that starts and reads; else the last one, to recover later."""
    skipped = []
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


def connect_sim_counters(
    telemetry: TelemetrySource | None, node: NodeService, gate: ProfileGate
) -> None:
    """On the simulated node, device counters follow the leases placed there."""
    counters = getattr(telemetry, "counters", None)
    if isinstance(counters, SimCounters):
        counters.signature = gate.lease_counters
        counters.leases = lambda uuid: [x for x in node.leases.values() if x.device_uuid == uuid]
