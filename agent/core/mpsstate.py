"""What the agent knows of each device's MPS control daemon and the servers it runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MpsServerState:
    """An MPS server process of a device's daemon and the client PIDs it serves."""

    pid: int
    client_pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class MpsDaemonState:
    """What the agent knows about the MPS control daemon of one device."""

    device_uuid: str
    up: bool
    backend: str
    pid: int | None = None
    restarts: int = 0
    default_thread_pct: float | None = None
    default_memory_limit_bytes: int | None = None
    detail: str = ""
    pipe_dir: str = ""
    servers: tuple[MpsServerState, ...] = ()
    defaults_drift_total: int = 0
    pipe_permission_violations_total: int = 0  # mode or owner changes found at probes
    answering: bool = True  # False from the first unanswered probe to the next answered one
