"""Every setting of the agent: :class:`Settings`, its groups by name, in the order the
reference and ``gpushare config show`` list them.

Each capability's group lives in a module of its own (``api``, ``mps``, ``telemetry``,
``admission``, ``estimator``, ``control``, ``kubelet``, ``dra``); here are the agent
process's own: where it keeps its files, how it runs and stops, and whether its node is
simulated. Each field carries ``doc`` (shown by ``gpushare config show --doc`` and in
``docs/configuration.md``) and optionally ``min``/``choices`` for validation. Defaults
that are paths depend on who runs the agent: root gets the system paths (``/run``,
``/var/lib``), anyone else gets per-user paths, so a developer can run the simulated node
without privileges.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from agent.config.admission import AdmissionSettings
from agent.config.api import ApiSettings
from agent.config.control import DegradationSettings, JanitorSettings, ReadinessSettings
from agent.config.dra import DraSettings
from agent.config.estimator import EstimatorSettings
from agent.config.fields import setting
from agent.config.kubelet import KubeletSettings
from agent.config.mps import MpsSettings
from agent.config.telemetry import TelemetrySettings

CONFIG_VERSION = 1


def default_runtime_dir() -> str:
    if os.geteuid() == 0:
        return "/run/gpushare"
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return f"{base}/gpushare-{os.geteuid()}"


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/gpushare"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return f"{base}/gpushare"


@dataclass(frozen=True, slots=True)
class PathSettings:
    runtime_dir: str = setting(
        default_runtime_dir(),
        "Directory for the CLI socket, the instance lock and MPS pipe directories.",
        default_doc="/run/gpushare (root) or $XDG_RUNTIME_DIR/gpushare-<uid>",
    )
    state_sync: str = setting(
        "full",
        "How the lease store syncs a commit: 'full' fsyncs before any answer (survives power "
        "loss); 'normal' writes before the answer but fsyncs at checkpoints (survives an "
        "agent crash, not a power cut; several times faster per admission).",
        choices=("full", "normal"),
    )
    state_dir: str = setting(
        default_state_dir(),
        "Directory for durable state (the lease store).",
        default_doc="/var/lib/gpushare (root) or $XDG_STATE_HOME/gpushare",
    )


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    node_name: str = setting(
        socket.gethostname(),
        "Name of this node in events, metrics and GetNode.",
        default_doc="the host name",
    )
    shutdown_grace_s: float = setting(
        10.0,
        "On SIGTERM/SIGINT, seconds allowed for an orderly stop before tasks are cancelled "
        "and child processes killed; the process exits within this time.",
        min=0.5,
    )
    lock_wait_s: float = setting(
        0.0,
        "How long a starting agent waits for another agent of the node to stop and free "
        "the single-agent lock (a DaemonSet upgrade starts the new pod while the old one "
        "stops; the chart sets 60). 0: refuse at once, exit code 3.",
        min=0.0,
    )
    on_stop: str = setting(
        "keep",
        "What a stop does to the MPS daemons: 'keep' (left running with their servers and "
        "clients; the next agent adopts them), 'drain' (admissions refused, wait up to "
        "runtime.drain_timeout_s for the leases to end, then quit) or 'quit' (stop them: "
        "running jobs lose their MPS server). Also: serve --on-stop.",
        choices=("keep", "drain", "quit"),
    )
    drain_timeout_s: float = setting(
        300.0, "With on_stop 'drain': how long to wait for the live leases to end.", min=0.0
    )
    log_level: str = setting("info", "Log level.", choices=("debug", "info", "warning", "error"))
    log_format: str = setting("text", "Log line format.", choices=("text", "json"))


@dataclass(frozen=True, slots=True)
class SimSettings:
    enabled: bool = setting(
        False, "Run on a simulated node instead of real GPUs (also: serve --sim)."
    )
    node_file: str = setting(
        "",
        "YAML description of the simulated node's devices. Empty: 4 x H100 80GB.",
    )


@dataclass(frozen=True, slots=True)
class Settings:
    paths: PathSettings = field(default_factory=PathSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    mps: MpsSettings = field(default_factory=MpsSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    estimator: EstimatorSettings = field(default_factory=EstimatorSettings)
    readiness: ReadinessSettings = field(default_factory=ReadinessSettings)
    janitor: JanitorSettings = field(default_factory=JanitorSettings)
    degradation: DegradationSettings = field(default_factory=DegradationSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    kubelet: KubeletSettings = field(default_factory=KubeletSettings)
    dra: DraSettings = field(default_factory=DraSettings)
    sim: SimSettings = field(default_factory=SimSettings)

    @property
    def unix_socket_path(self) -> str:
        return self.api.unix_socket or f"{self.paths.runtime_dir}/agent.sock"

    @property
    def state_db_path(self) -> str:
        return f"{self.paths.state_dir}/gpushare.db"

    @property
    def mps_root_dir(self) -> str:
        return self.mps.root_dir or f"{self.paths.runtime_dir}/mps"
