"""Every setting of the agent, grouped, with its default and what it means.

Each field carries ``doc`` (shown by ``gpushare config show --doc`` and in
``docs/configuration.md``) and optionally ``min``/``choices`` for validation. Defaults
that are paths depend on who runs the agent: root gets the system paths (``/run``,
``/var/lib``), anyone else gets per-user paths, so a developer can run the simulated node
without privileges.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from agent.config.dra import DraSettings
from agent.config.fields import setting
from agent.config.kubelet import KubeletSettings
from agent.config.mps import MpsSettings

CONFIG_VERSION = 1


_setting = setting


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
    runtime_dir: str = _setting(
        default_runtime_dir(),
        "Directory for the CLI socket, the instance lock and MPS pipe directories.",
        default_doc="/run/gpushare (root) or $XDG_RUNTIME_DIR/gpushare-<uid>",
    )
    state_sync: str = _setting(
        "full",
        "How the lease store syncs a commit: 'full' fsyncs before any answer (survives power "
        "loss); 'normal' writes before the answer but fsyncs at checkpoints (survives an "
        "agent crash, not a power cut; several times faster per admission).",
        choices=("full", "normal"),
    )
    state_dir: str = _setting(
        default_state_dir(),
        "Directory for durable state (the lease store).",
        default_doc="/var/lib/gpushare (root) or $XDG_STATE_HOME/gpushare",
    )


@dataclass(frozen=True, slots=True)
class ApiSettings:
    unix_socket: str = _setting(
        "",
        "Path of the gRPC Unix socket the CLI uses (mode 0660). Empty: <runtime_dir>/agent.sock.",
    )
    tcp_listen: str = _setting(
        "", "host:port of the gRPC listener for the scheduler. Empty: no TCP listener."
    )
    http_listen: str = _setting(
        "127.0.0.1:9808",
        "host:port of the HTTP server for /metrics, /healthz and /readyz. Empty: disabled.",
    )
    token_file: str = _setting(
        "",
        "File holding the bearer token TCP callers must send (authorization: Bearer <token>), "
        "or one 'NAME TOKEN' line per caller (the name owns the leases it makes): "
        "owned by the agent's user, mode 0600 or 0400, at least 128 bits of entropy. Needs "
        "server TLS (api.tls_cert_file/tls_key_file) unless api.insecure_loopback. Read at "
        "start, on SIGHUP and when it changes (api.secrets_check_s); never logged.",
    )
    tls_cert_file: str = _setting(
        "", "Server certificate (PEM) of the TCP listener; re-read on SIGHUP and on a change."
    )
    tls_key_file: str = _setting(
        "", "Server private key (PEM) of the TCP listener; re-read on SIGHUP and on a change."
    )
    tls_client_ca_file: str = _setting(
        "",
        "CA (PEM) that client certificates must chain to: set it for mutual TLS. Empty: "
        "server TLS only, and api.token_file is required.",
    )
    insecure_loopback: bool = _setting(
        False,
        "Allow a plaintext TCP listener with a bearer token, on a loopback address only (for "
        "development; logs a warning). A TCP listener without TLS is refused otherwise.",
    )
    observers: str = _setting(
        "",
        "Comma-separated caller names (certificate common names or token names) with the "
        "observer role: they see every caller's lease ids in GetNode and WatchEvents. Others "
        "see only their own.",
    )
    max_batch: int = _setting(1024, "Most requests in one AdmitBatch.", min=1)
    secrets_check_s: float = _setting(
        30.0,
        "Seconds between checks of the token and TLS files for a change; a change reloads "
        "them as SIGHUP does (a Kubernetes Secret update reaches the agent with no signal). "
        "0: only on SIGHUP.",
        min=0.0,
    )


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    source: str = _setting(
        "auto",
        "Counter source. 'auto': the simulated node's own on --sim; otherwise DCGM if its "
        "bindings and host engine answer, then dcgm-exporter at exporter_url, then NVML.",
        choices=("auto", "dcgm", "exporter", "nvml", "sim"),
    )
    exporter_url: str = _setting(
        "http://127.0.0.1:9400/metrics", "The dcgm-exporter endpoint to scrape."
    )
    exporter_timeout_s: float = _setting(
        2.0, "Seconds a scrape of the exporter may take.", min=0.05
    )
    dcgm_host: str = _setting("localhost", "The DCGM host engine (nv-hostengine) to connect to.")
    keep_windows: int = _setting(
        60, "Closed windows kept per device (memory is bounded by this).", min=1
    )
    sample_interval_s: float = _setting(
        1.0, "Seconds between two counter samples of every device.", min=0.01
    )
    window_s: float = _setting(10.0, "Length in seconds of a fixed aggregation window.", min=0.01)
    stale_after_s: float = _setting(
        5.0,
        "A device whose newest sample is older than this is 'stale': no decision uses it.",
        min=0.01,
    )


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    memory_reserve: str = _setting(
        "1GiB", "Device memory never given to leases (driver, fragmentation head-room)."
    )
    context_overhead: str = _setting(
        "512MiB", "Device memory counted for each client's CUDA context, on top of its limit."
    )
    thread_budget_pct: float = _setting(
        200.0,
        "Sum of the thread percentages of a device's leases may reach this (they are caps, "
        "not reservations).",
        min=1.0,
    )
    guaranteed_budget_pct: float = _setting(
        100.0, "Sum of the thread percentages of guaranteed leases on a device.", min=1.0
    )
    max_clients: int = _setting(
        48, "Leases per device (the MPS client limit of Volta and later).", min=1
    )
    placement: str = _setting(
        "best-fit",
        "How a device is chosen among those that fit.",
        choices=("best-fit", "first-fit", "worst-fit"),
    )
    reservation_ttl_s: float = _setting(
        30.0, "Default life of a Reserve that is not committed.", min=0.1
    )
    standard_sizes: str = _setting(
        "10GiB/12.5,20GiB/25,40GiB/50",
        "Request sizes (memory/threads %) that stranded capacity is measured against.",
    )
    ended_retention_s: float = _setting(
        7 * 86400.0,
        "How long an ended lease and its request id are kept: a retry within it gets the "
        "same answer ('released', 'expired'); after it the id may be used again.",
        min=60.0,
    )
    event_retention_s: float = _setting(
        7 * 86400.0, "How long events are kept for WatchEvents catch-up.", min=60.0
    )
    max_events: int = _setting(
        100_000, "Events kept at most for catch-up (the oldest go first).", min=1000
    )


@dataclass(frozen=True, slots=True)
class ReadinessSettings:
    deadline_s: float = _setting(
        600.0, "Seconds an admitted lease has for a client to appear on its device.", min=0.1
    )
    policy: str = _setting(
        "report",
        "What happens to a lease still not ready at its deadline: 'report' (an event, the "
        "lease stays) or 'reclaim' (the lease becomes ineffective; its capacity is freed).",
        choices=("report", "reclaim"),
    )
    interval_s: float = _setting(2.0, "Seconds between two readiness checks.", min=0.05)
    model_dir: str = _setting(
        "default",
        "Readiness predictor for AdmitBatch ordering (from `gpushare readiness train`). "
        "'default': the model shipped with the agent (synthetic training data); 'none': "
        "arrival order.",
    )


@dataclass(frozen=True, slots=True)
class JanitorSettings:
    interval_s: float = _setting(10.0, "Seconds between two janitor passes.", min=0.05)
    unknown_clients: str = _setting(
        "report",
        "MPS clients that belong to no lease: 'report' (an event once) or 'terminate' "
        "(terminate_client).",
        choices=("report", "terminate"),
    )
    exit_grace_s: float = _setting(
        60.0,
        "Seconds after a ready lease's last process exited before the lease is released.",
        min=0.0,
    )
    memory_policy: str = _setting(
        "report",
        "A lease whose processes use more device memory than its limit: 'report' (a "
        "violation event and metric) or 'enforce' (its clients are terminated too: only "
        "those its cgroup says are its own, see mps.md).",
        choices=("report", "enforce"),
    )


@dataclass(frozen=True, slots=True)
class DegradationSettings:
    windows: int = _setting(
        3, "w: consecutive windows under floor that degrade a device (and above, recover).", min=1
    )
    margin: float = _setting(
        0.05, "Hysteresis: recovery needs every protected lease at floor + margin.", min=0.0
    )
    cooldown_windows: int = _setting(
        3, "Windows to wait after an eviction before the next one.", min=0
    )
    evict: bool = _setting(
        True, "Evict the youngest best-effort lease of a degraded device (never guaranteed)."
    )


@dataclass(frozen=True, slots=True)
class EstimatorSettings:
    model_dir: str = _setting(
        "default",
        "Retention model folder (from `gpushare estimator train`). 'default': the model "
        "shipped with the agent (synthetic training data); 'none': the utilisation-sum rule.",
    )
    profiles_dir: str = _setting(
        "/etc/gpushare/profiles", "Folder of workload profiles (*.yaml) requests may name."
    )
    coverage: float = _setting(
        0.9,
        "Coverage of the retention gate's conservative estimate: the share of co-locations "
        "whose true retention is at or above it (calibrated in training; a model stores "
        "every level from 0.5 to 0.99).",
        min=0.5,
        max=0.99,
    )
    gate_precision: float = _setting(
        0.95,
        "Precision the retention gate is run at: of the co-locations it admits, the share "
        "that keep their floor. The gate admits when P(retention >= floor) reaches the "
        "threshold chosen for this precision in the model's grouped cross-validation (a "
        "model stores thresholds from 0.80 to 0.99).",
        min=0.8,
        max=0.99,
    )
    base_data: str = _setting(
        "default",
        "Run records (JSON Lines) the node's own records are added to when the estimator "
        "learns on the node. 'default': the synthetic records the shipped model was trained "
        "on; 'none': the node's records only.",
    )
    retrain_interval_s: float = _setting(
        0.0,
        "Seconds between retrains of the retention model on the node's own run records (and "
        "base_data); the new model replaces the current one only when it beats it. 0: off "
        "(`gpushare estimator train --from-node` retrains on demand).",
        min=0.0,
    )
    retrain_min_records: int = _setting(
        30,
        "Node run records needed before a retrain is tried.",
        min=1,
    )
    progress_window_s: float = _setting(
        10.0,
        "Shortest span of progress reports (ReportProgress) a co-location window must "
        "cover to become a run record.",
        min=0.05,
    )


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    node_name: str = _setting(
        socket.gethostname(),
        "Name of this node in events, metrics and GetNode.",
        default_doc="the host name",
    )
    shutdown_grace_s: float = _setting(
        10.0,
        "On SIGTERM/SIGINT, seconds allowed for an orderly stop before tasks are cancelled "
        "and child processes killed; the process exits within this time.",
        min=0.5,
    )
    lock_wait_s: float = _setting(
        0.0,
        "How long a starting agent waits for another agent of the node to stop and free "
        "the single-agent lock (a DaemonSet upgrade starts the new pod while the old one "
        "stops; the chart sets 60). 0: refuse at once, exit code 3.",
        min=0.0,
    )
    on_stop: str = _setting(
        "keep",
        "What a stop does to the MPS daemons: 'keep' (left running with their servers and "
        "clients; the next agent adopts them), 'drain' (admissions refused, wait up to "
        "runtime.drain_timeout_s for the leases to end, then quit) or 'quit' (stop them: "
        "running jobs lose their MPS server). Also: serve --on-stop.",
        choices=("keep", "drain", "quit"),
    )
    drain_timeout_s: float = _setting(
        300.0, "With on_stop 'drain': how long to wait for the live leases to end.", min=0.0
    )
    log_level: str = _setting("info", "Log level.", choices=("debug", "info", "warning", "error"))
    log_format: str = _setting("text", "Log line format.", choices=("text", "json"))


@dataclass(frozen=True, slots=True)
class SimSettings:
    enabled: bool = _setting(
        False, "Run on a simulated node instead of real GPUs (also: serve --sim)."
    )
    node_file: str = _setting(
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
