"""The MPS control daemons the agent starts (or adopts) and how it watches them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.config.fields import setting as _setting
from agent.core.errors import ConfigError, GpushareError
from agent.core.units import MIB, parse_bytes

_KUBERNETES_SUFFIX = re.compile(r"^(.*\d\s*[KkMmGgTt])i$")  # 1Gi, as Kubernetes writes it


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
    shm_root: str = _setting(
        "",
        "Where each MPS device gets shared memory of its own: <shm_root>/<device UUID>, a "
        "tmpfs of mps.shm_size (mode 1777, nosuid, nodev, noexec) that the device's control "
        "daemon and its servers see as /dev/shm (a mount namespace of their own) and that "
        "only the containers of the device's current trust domain get; emptied, with the "
        "servers shut down and the defaults set again, before another trust domain gets "
        "it. Needs root (else the daemons share their starter's /dev/shm, with a warning). "
        "Empty: none; every daemon shares its starter's /dev/shm and client containers get "
        "kubelet.shm_dir / dra.shm_dir. Clients outside containers need it empty.",
    )
    shm_size: str = _setting(
        "1GiB",
        "Size of each device's shared-memory tmpfs under mps.shm_root (1GiB, 512MiB; 1Gi "
        "as Kubernetes writes it is read the same). At least 1MiB.",
    )

    def __post_init__(self) -> None:
        if self.shm_root and not self.shm_root.startswith("/"):
            raise ConfigError("mps.shm_root", f"must be an absolute path (got {self.shm_root!r})")
        if self.shm_root.rstrip("/") in ("", "/dev/shm") and self.shm_root:
            raise ConfigError("mps.shm_root", f"cannot be {self.shm_root!r}")
        self.shm_size_bytes  # noqa: B018 (refuses a size it cannot read, at load)

    @property
    def shm_size_bytes(self) -> int:
        """mps.shm_size in bytes; a ConfigError names the setting."""
        text = self.shm_size.strip()
        found = _KUBERNETES_SUFFIX.match(text)
        try:
            value = parse_bytes(f"{found[1]}iB" if found else text)
        except GpushareError as exc:
            raise ConfigError("mps.shm_size", str(exc)) from exc
        if value < MIB:
            raise ConfigError("mps.shm_size", f"must be at least 1MiB (got {self.shm_size!r})")
        return value
