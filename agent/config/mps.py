"""The MPS control daemons the agent starts (or adopts) and how it watches them."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config.fields import setting as _setting


@dataclass(frozen=True, slots=True)
class MpsSettings:
    control_binary: str = _setting(
        "auto",
        "The MPS control front-end. 'auto': nvidia-cuda-mps-control from PATH; on a "
        "simulated node without it, the bundled fake (gpushare-fake-mps-control). "
        "Or a path to a binary.",
    )
    root_dir: str = _setting(
        "", "Where each device's pipe and log directories live. Empty: <runtime_dir>/mps."
    )
    default_thread_pct: float = _setting(
        100.0,
        "Default active-thread percentage applied to each device's MPS control daemon.",
        min=0.1,
        max=100.0,
    )
    default_memory_limit: str = _setting(
        "",
        "Default pinned device-memory limit per client applied to each daemon, e.g. 70GiB. "
        "Empty: no default limit (leases carry their own).",
    )
    command_timeout_s: float = _setting(
        3.0, "Seconds a control command may take before the daemon counts as hung.", min=0.1
    )
    probe_interval_s: float = _setting(
        2.0, "Seconds between two health probes (and defaults read-backs) of a daemon.", min=0.05
    )
    hung_after_probes: int = _setting(
        2, "Unanswered probes in a row after which a daemon is killed and restarted.", min=1
    )
    start_timeout_s: float = _setting(
        10.0, "Seconds a new daemon has to answer its first command.", min=0.5
    )
    restart_backoff_initial_s: float = _setting(
        0.5, "First delay before restarting a failed daemon; doubles per failure.", min=0.0
    )
    restart_backoff_max_s: float = _setting(
        30.0, "Longest delay between two restart attempts.", min=0.1
    )
    quit_timeout_s: int = _setting(
        5, "The -t of 'quit' when the agent stops a daemon; then SIGTERM, then SIGKILL.", min=0
    )
    client_group: str = _setting(
        "gpushare",
        "Group whose members may reach the pipe and log directories (root and this group, "
        "mode 0750). If it does not exist: root only (0700), with a warning.",
    )
    client_gid: int = _setting(
        -1,
        "Numeric group for the pipe and log directories, instead of mps.client_group. "
        "-1: use mps.client_group.",
        min=-1,
    )
    multi_user: bool = _setting(
        False, "Start daemons in multi-user mode (-M); refused if the binary lacks it."
    )
    launch: str = _setting(
        "agent",
        "Who starts the control daemons. 'agent': the agent starts them (and adopts live "
        "ones). 'host': `gpushare mps host`, a process of its own (its own DaemonSet with "
        "updateStrategy OnDelete, or its own systemd unit), starts and keeps them; the agent "
        "adopts, configures and watches them and never starts or stops one, so replacing "
        "the agent never restarts a daemon.",
        choices=("agent", "host"),
    )
