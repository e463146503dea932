"""What ``gpushare doctor`` finds: a :class:`Finding` per check, and the facts the checks
read, gathered on the node by :mod:`agent.doctor.gather` and the CLI."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "skip"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's outcome: ``status``, the ``check``'s name, what was ``found``, the ``fix``."""

    status: Status
    check: str
    found: str
    fix: str = ""


def render(findings: Sequence[Finding]) -> list[str]:
    """``STATUS  CHECK  FOUND  [fix: FIX]``, the check names padded to one column."""
    width = max((len(f.check) for f in findings), default=0)
    return [
        f"{f.status:<4}  {f.check:<{width}}  {f.found}" + (f"  fix: {f.fix}" if f.fix else "")
        for f in findings
    ]


def failed(findings: Sequence[Finding]) -> bool:
    return any(f.status == "fail" for f in findings)


# -- facts ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PathFacts:
    """A path as ``lstat`` saw it; ``writable``: by the user running the doctor."""

    path: str
    exists: bool
    is_dir: bool = False
    mode: int = 0  # permission bits, with setuid/setgid/sticky
    uid: int = -1
    gid: int = -1
    writable: bool = False
    error: str = ""  # why it could not be looked at (not "missing")

    def shown(self) -> str:
        return f"{self.mode:04o} uid {self.uid} gid {self.gid}"


@dataclass(frozen=True, slots=True)
class BinaryFacts:
    """The MPS control binary that would be used, as resolved by ``mps.control_binary``."""

    configured: str  # 'auto' or the setting's value
    path: str  # "" when none was found
    executable: bool = False
    release: str | None = None  # the driver release it carries, if one
    fake: bool = False  # the bundled gpushare-fake-mps-control


@dataclass(frozen=True, slots=True)
class DriverFacts:
    simulated: bool
    version: str | None = None  # NVML's driver version
    error: str = ""  # why NVML could not be asked


@dataclass(frozen=True, slots=True)
class KubeFacts:
    """What the Kubernetes API said; ``api`` empty when there is none to ask (``why``).
    ``identity``: who asked (the pod's service account, or a token file), named in fixes;
    ``driver``: the agent is the DRA driver, which reads its Node itself (dra.enabled)."""

    api: str = ""
    why: str = ""
    node_name: str = ""
    node: Mapping[str, Any] | None = None
    node_error: str = ""
    node_status: int = 0  # the HTTP status of a failed read (0: none, or no answer)
    runtime_class: str = "nvidia"
    runtime_class_found: bool | None = None  # None: could not be asked
    runtime_class_error: str = ""
    runtime_class_status: int = 0
    identity: str = "the service account"
    user: str = ""  # the token's user (system:serviceaccount:NS:NAME) where it says one
    driver: bool = False


@dataclass(frozen=True, slots=True)
class DeviceDirs:
    """``<mps root>/<uuid>`` and its pipe and log directories."""

    uuid: str
    base: PathFacts
    pipe: PathFacts
    log: PathFacts


@dataclass(frozen=True, slots=True)
class MpsDirFacts:
    root: PathFacts
    devices: Sequence[DeviceDirs] = ()
    agent_uid: int = 0  # the agent's user: the directories' owner
    client_gid: int | None = None  # the client group's gid; None: the agent's user alone
    group: str = ""  # mps.client_group as configured ("" with mps.client_gid)
    group_missing: bool = False  # mps.client_group names no group here
    agent_running: bool = False


@dataclass(frozen=True, slots=True)
class DeviceShm:
    """A device's shared memory (mps.shm_root): what its daemon's servers see at /dev/shm
    (``state``: own, shared, legacy, mismatch, or none without a daemon; ``reason`` why
    not its own) and what is mounted at ``<shm_root>/<uuid>`` (``fstype`` "" nothing)."""

    uuid: str
    directory: str
    state: str
    reason: str = ""
    fstype: str = ""
    size_bytes: int | None = None
    lacks: tuple[str, ...] = ()  # of nosuid, nodev, noexec


@dataclass(frozen=True, slots=True)
class ShmFacts:
    kubelet_enabled: bool
    kubelet_shm_dir: str
    dra_enabled: bool
    dra_shm_dir: str
    directory: PathFacts | None = None  # the one configured shared directory, if any
    client_gid: int | None = None
    shm_root: str = ""  # mps.shm_root: a tmpfs per device under it ("" none)
    root: PathFacts | None = None  # mps.shm_root on disk
    devices: Sequence[DeviceShm] = ()  # the devices that have an MPS directory
    in_pod: bool = False  # the doctor runs in a pod: host paths are seen only if mounted


@dataclass(frozen=True, slots=True)
class CertFacts:
    """A TLS file named by a setting: its certificates' validity (not_before, not_after)."""

    key: str  # the setting, e.g. api.tls_cert_file
    path: str
    error: str = ""  # unreadable or not PEM
    validity: Sequence[tuple[datetime, datetime]] = field(default_factory=tuple)
    is_key: bool = False  # a private key: only readability is checked


@dataclass(frozen=True, slots=True)
class AgentFacts:
    where: str
    error: str = ""
    node_name: str = ""
    devices: int = 0
    simulated: bool = False
    version: str = ""
