"""How a device's MPS control daemon is kept (``mps.*`` settings, resolved): the options of
its supervisor and the defaults it applies, shared by the agent's supervisor, the MPS host
and the start of a daemon with shared memory of its own (:mod:`agent.mps.shm`)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.mps.shmstate import NO_SHM, ShmOptions


@dataclass(frozen=True, slots=True)
class SupervisorOptions:
    binary: str
    root_dir: str
    probe_interval_s: float = 2.0
    hung_after_probes: int = 2
    start_timeout_s: float = 10.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    quit_timeout_s: int = 5
    client_gid: int = -1
    client_group: str = ""
    multi_user: bool = False
    by_host: bool = False  # mps.launch 'host': adopt only, never start or stop a daemon
    shm: ShmOptions = NO_SHM  # mps.shm_root, mps.shm_size


@dataclass(frozen=True, slots=True)
class DaemonDefaults:
    thread_pct: float
    memory_limit_bytes: int | None = None
