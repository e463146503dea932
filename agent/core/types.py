"""The agent's vocabulary as frozen dataclasses: devices, what a caller asks for and what
it is answered, and events. A device's counters (``samples``), its MPS daemon
(``mpsstate``), what the agent learns from (``learning``) and the node's snapshot
(``snapshot``) have modules of their own.

Units are in the field names (``memory_bytes``, ``window_s``, ``thread_pct``). Times are
seconds since the Unix epoch (``*_at``) or durations in seconds (``*_s``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from agent.core.errors import GpushareError, ValidationError

if TYPE_CHECKING:
    from agent.core.lease import Lease


class SharingMode(enum.StrEnum):
    """How a device is shared: one lease at a time, or many clients of one MPS server."""

    EXCLUSIVE = "exclusive"
    MPS = "mps"


class PriorityClass(enum.StrEnum):
    """Priority of a lease. Only ``best-effort`` leases may be preempted or evicted."""

    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BEST_EFFORT = "best-effort"

    @property
    def rank(self) -> int:
        """Higher is more important: guaranteed 2, burstable 1, best-effort 0."""
        return {"guaranteed": 2, "burstable": 1, "best-effort": 0}[self.value]


class ReasonCode(enum.StrEnum):
    """Why an admission was refused. Every rejection carries one, plus a sentence."""

    NO_MEMORY = "NO_MEMORY"
    NO_COMPUTE = "NO_COMPUTE"
    TRUST_CONFLICT = "TRUST_CONFLICT"
    USER_CONFLICT = "USER_CONFLICT"  # the device's MPS server runs as another UID
    RETENTION_BELOW_FLOOR = "RETENTION_BELOW_FLOOR"
    DEVICE_DEGRADED = "DEVICE_DEGRADED"
    DRAINING = "DRAINING"
    MODEL_MISMATCH = "MODEL_MISMATCH"
    CLIENT_LIMIT = "CLIENT_LIMIT"
    EXCLUSIVE_BUSY = "EXCLUSIVE_BUSY"
    DEVICE_UNAVAILABLE = "DEVICE_UNAVAILABLE"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    REQUEST_ID_CONFLICT = "REQUEST_ID_CONFLICT"  # a batch item whose id cannot be used


@dataclass(frozen=True, slots=True)
class Device:
    """A schedulable unit: a whole GPU or a MIG instance, identified by UUID."""

    uuid: str
    index: int
    model: str
    memory_bytes: int
    sharing_mode: SharingMode = SharingMode.MPS
    compute_capability: tuple[int, int] = (9, 0)
    parent_uuid: str | None = None
    mig_profile: str | None = None
    gpu_instance_id: int | None = None  # MIG: the GPU instance id on the parent GPU
    # The GPU's device node is /dev/nvidia<minor> (NVML's minor number, which need not
    # follow the index); a MIG instance has its parent GPU's. None: not known.
    minor: int | None = None
    compute_instance_id: int | None = None  # MIG: the compute instance id in its GPU instance

    def __post_init__(self) -> None:
        if not self.uuid:
            raise ValidationError("uuid", "a device needs a UUID")
        if self.index < 0:
            raise ValidationError("index", f"device index {self.index} is negative")
        if self.minor is not None and self.minor < 0:
            raise ValidationError("minor", f"device minor number {self.minor} is negative")
        if self.memory_bytes <= 0:
            raise ValidationError("memory_bytes", f"device {self.uuid} has no memory")

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process with a compute context on a device, as NVML lists it."""

    pid: int
    used_memory_bytes: int | None
    mps: bool = False


@dataclass(frozen=True, slots=True)
class JobAttributes:
    """What the caller knows of the job at admission, for the readiness predictor (all
    optional): its type and model, whether it serves generative requests, how many GPUs the
    whole job asked for (may be fractional), its declared run time, and how long it waited
    in the scheduler before this request."""

    job_type: str = ""
    model_type: str = ""
    generative: bool = False
    requested_gpus: float = 0.0
    declared_duration_s: float = 0.0
    scheduling_delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """What a caller asks for: memory and compute on one device of this node."""

    request_id: str
    tenant: str
    trust_domain: str
    priority: PriorityClass
    memory_bytes: int
    thread_pct: float
    profile: str | None = None
    retention_floor: float | None = None
    gpu_model: str | None = None
    counters: Mapping[str, float] = field(default_factory=dict)  # solo counters, inline
    job: JobAttributes = field(default_factory=JobAttributes)
    # The workload its processes must belong to ("pod:<uid>", "container:<id>",
    # "unit:<name>"), or "" for none.
    workload: str = ""
    pod: str = ""  # the Kubernetes pod it is for, "<namespace>/<name>"; "" for none
    # Only this device may take it (a DRA share: the scheduler chose the device); None: any.
    device_uuid: str | None = None
    # The caller identity that asks (the mTLS subject or the token's name; "local" on the
    # Unix socket): set by the API from the connection, never from the request's fields.
    owner: str = ""
    run_as_uid: int | None = None  # the UID its processes run as; None: not said, not checked


@dataclass(frozen=True, slots=True)
class DeviceAttempt:
    """Why one device did or did not take a request; part of every explanation.
    ``predictions``: estimated retention of the candidate (``"candidate"``) and of each
    current lease (by id) if the request joined this device. ``checked`` is False for a
    device that passed the rules but was not put to the retention gate because a
    better-fitting device was accepted first."""

    device_uuid: str
    fits: bool
    reason: ReasonCode | None = None
    detail: str = ""
    predictions: Mapping[str, float] = field(default_factory=dict)
    checked: bool = True


@dataclass(frozen=True, slots=True)
class RetentionVerdict:
    """What the retention gate says of a request joining a device."""

    ok: bool
    predictions: Mapping[str, float] = field(default_factory=dict)
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to a request: admitted onto a device, or refused with a reason."""

    admitted: bool
    device_uuid: str | None = None
    reason: ReasonCode | None = None
    message: str = ""
    attempts: tuple[DeviceAttempt, ...] = ()
    preempted_lease_ids: tuple[str, ...] = ()
    preempted_lease_s: float = 0.0  # lease time the preempted leases had run
    predictions: Mapping[str, float] = field(default_factory=dict)
    estimator: str = ""  # what produced the predictions: a model, or the fallback rule

    def __post_init__(self) -> None:
        if self.admitted and self.device_uuid is None:
            raise ValidationError("device_uuid", "an admitted decision names its device")
        if not self.admitted and self.reason is None:
            raise ValidationError("reason", "a refusal carries a reason code")


@dataclass(frozen=True, slots=True)
class Event:
    """Something the agent did or saw.

    ``seq`` is dense and increasing per node (0 on a draft not yet written); ``epoch``
    counts the agent's starts, so a watcher can tell a restart from a loss.
    """

    seq: int
    at: float
    kind: str
    message: str
    device_uuid: str | None = None
    lease_id: str | None = None
    attrs: Mapping[str, str] = field(default_factory=dict)
    epoch: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))


@dataclass(frozen=True, slots=True)
class AdmitResult:
    """A decision, and when admitted the lease, its environment and the paths to mount.

    ``error`` is set on an item of a batch that could not be decided at all (a reused
    request id, say): that item's own error, the others still stand."""

    decision: Decision
    lease: Lease | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[tuple[str, str], ...] = ()
    error: GpushareError | None = None


@dataclass(frozen=True, slots=True)
class BatchResult:
    """An AdmitBatch answer: each request's result (in request order), the order they were
    placed in, and what ordered them (predicted readiness, or arrival)."""

    results: tuple[AdmitResult, ...]
    order: tuple[str, ...]  # request ids, as placed
    ready_probability: tuple[float, ...] = ()  # per request, in request order
    ordered_by: str = "arrival"
