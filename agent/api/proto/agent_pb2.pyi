from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    GUARANTEED: _ClassVar[Priority]
    BURSTABLE: _ClassVar[Priority]
    BEST_EFFORT: _ClassVar[Priority]
PRIORITY_UNSPECIFIED: Priority
GUARANTEED: Priority
BURSTABLE: Priority
BEST_EFFORT: Priority

class Sizing(_message.Message):
    __slots__ = ("parameters", "mode", "dtype", "layers", "kv_heads", "head_dim", "context_length", "concurrent_sequences")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CONCURRENT_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    parameters: int
    mode: str
    dtype: str
    layers: int
    kv_heads: int
    head_dim: int
    context_length: int
    concurrent_sequences: int
    def __init__(self, parameters: _Optional[int] = ..., mode: _Optional[str] = ..., dtype: _Optional[str] = ..., layers: _Optional[int] = ..., kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., context_length: _Optional[int] = ..., concurrent_sequences: _Optional[int] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("request_id", "tenant", "trust_domain", "priority", "memory_bytes", "sizing", "thread_pct", "profile", "retention_floor", "gpu_model", "counters", "job", "workload", "pod", "run_as_uid")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TRUST_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIZING_FIELD_NUMBER: _ClassVar[int]
    THREAD_PCT_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FLOOR_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_UID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    trust_domain: str
    priority: Priority
    memory_bytes: int
    sizing: Sizing
    thread_pct: float
    profile: str
    retention_floor: float
    gpu_model: str
    counters: _containers.ScalarMap[str, float]
    job: Job
    workload: str
    pod: str
    run_as_uid: int
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., trust_domain: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., memory_bytes: _Optional[int] = ..., sizing: _Optional[_Union[Sizing, _Mapping]] = ..., thread_pct: _Optional[float] = ..., profile: _Optional[str] = ..., retention_floor: _Optional[float] = ..., gpu_model: _Optional[str] = ..., counters: _Optional[_Mapping[str, float]] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., workload: _Optional[str] = ..., pod: _Optional[str] = ..., run_as_uid: _Optional[int] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_type", "model_type", "generative", "requested_gpus", "declared_duration_s", "scheduling_delay_s")
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    GENERATIVE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_GPUS_FIELD_NUMBER: _ClassVar[int]
    DECLARED_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    SCHEDULING_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    job_type: str
    model_type: str
    generative: bool
    requested_gpus: float
    declared_duration_s: float
    scheduling_delay_s: float
    def __init__(self, job_type: _Optional[str] = ..., model_type: _Optional[str] = ..., generative: _Optional[bool] = ..., requested_gpus: _Optional[float] = ..., declared_duration_s: _Optional[float] = ..., scheduling_delay_s: _Optional[float] = ...) -> None: ...

class DeviceAttempt(_message.Message):
    __slots__ = ("device_uuid", "fits", "reason", "detail", "predictions")
    class PredictionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    fits: bool
    reason: str
    detail: str
    predictions: _containers.ScalarMap[str, float]
    def __init__(self, device_uuid: _Optional[str] = ..., fits: _Optional[bool] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., predictions: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("admitted", "device_uuid", "reason", "message", "attempts", "preempted_lease_ids", "preempted_lease_s", "predictions", "estimator")
    class PredictionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_LEASE_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATOR_FIELD_NUMBER: _ClassVar[int]
    admitted: bool
    device_uuid: str
    reason: str
    message: str
    attempts: _containers.RepeatedCompositeFieldContainer[DeviceAttempt]
    preempted_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    preempted_lease_s: float
    predictions: _containers.ScalarMap[str, float]
    estimator: str
    def __init__(self, admitted: _Optional[bool] = ..., device_uuid: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[DeviceAttempt, _Mapping]]] = ..., preempted_lease_ids: _Optional[_Iterable[str]] = ..., preempted_lease_s: _Optional[float] = ..., predictions: _Optional[_Mapping[str, float]] = ..., estimator: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "request_id", "gang_id", "tenant", "trust_domain", "device_uuid", "device_index", "priority", "memory_bytes", "thread_pct", "state", "created_at", "updated_at", "expires_at", "reason", "profile", "retention_floor", "owner", "workload", "pod", "run_as_uid")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TRUST_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    THREAD_PCT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FLOOR_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_UID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    request_id: str
    gang_id: str
    tenant: str
    trust_domain: str
    device_uuid: str
    device_index: int
    priority: str
    memory_bytes: int
    thread_pct: float
    state: str
    created_at: float
    updated_at: float
    expires_at: float
    reason: str
    profile: str
    retention_floor: float
    owner: str
    workload: str
    pod: str
    run_as_uid: int
    def __init__(self, lease_id: _Optional[str] = ..., request_id: _Optional[str] = ..., gang_id: _Optional[str] = ..., tenant: _Optional[str] = ..., trust_domain: _Optional[str] = ..., device_uuid: _Optional[str] = ..., device_index: _Optional[int] = ..., priority: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., thread_pct: _Optional[float] = ..., state: _Optional[str] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., expires_at: _Optional[float] = ..., reason: _Optional[str] = ..., profile: _Optional[str] = ..., retention_floor: _Optional[float] = ..., owner: _Optional[str] = ..., workload: _Optional[str] = ..., pod: _Optional[str] = ..., run_as_uid: _Optional[int] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("host_path", "container_path")
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    host_path: str
    container_path: str
    def __init__(self, host_path: _Optional[str] = ..., container_path: _Optional[str] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: Request
    def __init__(self, request: _Optional[_Union[Request, _Mapping]] = ...) -> None: ...

class AdmitResponse(_message.Message):
    __slots__ = ("decision", "lease", "env", "mounts", "error_code", "error_message", "isolation")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DECISION_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    lease: Lease
    env: _containers.ScalarMap[str, str]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    error_code: str
    error_message: str
    isolation: Isolation
    def __init__(self, decision: _Optional[_Union[Decision, _Mapping]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., isolation: _Optional[_Union[Isolation, _Mapping]] = ...) -> None: ...

class AdmitBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[Request]
    def __init__(self, requests: _Optional[_Iterable[_Union[Request, _Mapping]]] = ...) -> None: ...

class AdmitBatchResponse(_message.Message):
    __slots__ = ("results", "order", "ready_probability", "ordered_by")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    READY_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    ORDERED_BY_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AdmitResponse]
    order: _containers.RepeatedScalarFieldContainer[str]
    ready_probability: _containers.RepeatedScalarFieldContainer[float]
    ordered_by: str
    def __init__(self, results: _Optional[_Iterable[_Union[AdmitResponse, _Mapping]]] = ..., order: _Optional[_Iterable[str]] = ..., ready_probability: _Optional[_Iterable[float]] = ..., ordered_by: _Optional[str] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("request", "gang_id", "ttl_s")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    request: Request
    gang_id: str
    ttl_s: float
    def __init__(self, request: _Optional[_Union[Request, _Mapping]] = ..., gang_id: _Optional[str] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class GangRequest(_message.Message):
    __slots__ = ("gang_id",)
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    def __init__(self, gang_id: _Optional[str] = ...) -> None: ...

class GangResponse(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("since_seq", "window_ms")
    SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    since_seq: int
    window_ms: int
    def __init__(self, since_seq: _Optional[int] = ..., window_ms: _Optional[int] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "at", "kind", "message", "device_uuid", "lease_id", "attrs", "epoch")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    at: float
    kind: str
    message: str
    device_uuid: str
    lease_id: str
    attrs: _containers.ScalarMap[str, str]
    epoch: int
    def __init__(self, seq: _Optional[int] = ..., at: _Optional[float] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ..., device_uuid: _Optional[str] = ..., lease_id: _Optional[str] = ..., attrs: _Optional[_Mapping[str, str]] = ..., epoch: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("device_uuid", "reason")
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    reason: str
    def __init__(self, device_uuid: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, devices: _Optional[_Iterable[str]] = ...) -> None: ...

class ClearStaleRequest(_message.Message):
    __slots__ = ("dry_run",)
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    def __init__(self, dry_run: _Optional[bool] = ...) -> None: ...

class ClearStaleResponse(_message.Message):
    __slots__ = ("actions", "dry_run")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    def __init__(self, actions: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("lease_id", "units_done")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    UNITS_DONE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    units_done: float
    def __init__(self, lease_id: _Optional[str] = ..., units_done: _Optional[float] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("lease_id", "window_s", "rate_per_s", "peers", "records")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    window_s: float
    rate_per_s: float
    peers: int
    records: int
    def __init__(self, lease_id: _Optional[str] = ..., window_s: _Optional[float] = ..., rate_per_s: _Optional[float] = ..., peers: _Optional[int] = ..., records: _Optional[int] = ...) -> None: ...

class RetrainEstimatorRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RetrainEstimatorResponse(_message.Message):
    __slots__ = ("swapped", "reason", "figures", "node_records", "model_dir")
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SWAPPED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    NODE_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIR_FIELD_NUMBER: _ClassVar[int]
    swapped: bool
    reason: str
    figures: _containers.ScalarMap[str, float]
    node_records: int
    model_dir: str
    def __init__(self, swapped: _Optional[bool] = ..., reason: _Optional[str] = ..., figures: _Optional[_Mapping[str, float]] = ..., node_records: _Optional[int] = ..., model_dir: _Optional[str] = ...) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceLedger(_message.Message):
    __slots__ = ("device_uuid", "memory_committed_bytes", "threads_committed_pct", "leases", "closed", "closed_detail")
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_COMMITTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    THREADS_COMMITTED_PCT_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    CLOSED_DETAIL_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    memory_committed_bytes: int
    threads_committed_pct: float
    leases: int
    closed: str
    closed_detail: str
    def __init__(self, device_uuid: _Optional[str] = ..., memory_committed_bytes: _Optional[int] = ..., threads_committed_pct: _Optional[float] = ..., leases: _Optional[int] = ..., closed: _Optional[str] = ..., closed_detail: _Optional[str] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("ledger_only",)
    LEDGER_ONLY_FIELD_NUMBER: _ClassVar[int]
    ledger_only: bool
    def __init__(self, ledger_only: _Optional[bool] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("uuid", "index", "model", "memory_bytes", "sharing_mode", "compute_capability", "parent_uuid", "mig_profile", "isolation")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARING_MODE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    PARENT_UUID_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    model: str
    memory_bytes: int
    sharing_mode: str
    compute_capability: str
    parent_uuid: str
    mig_profile: str
    isolation: Isolation
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., model: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., sharing_mode: _Optional[str] = ..., compute_capability: _Optional[str] = ..., parent_uuid: _Optional[str] = ..., mig_profile: _Optional[str] = ..., isolation: _Optional[_Union[Isolation, _Mapping]] = ...) -> None: ...

class Isolation(_message.Message):
    __slots__ = ("memory", "faults", "compute")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    memory: str
    faults: str
    compute: str
    def __init__(self, memory: _Optional[str] = ..., faults: _Optional[str] = ..., compute: _Optional[str] = ...) -> None: ...

class MpsServer(_message.Message):
    __slots__ = ("pid", "client_pids")
    PID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_PIDS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    client_pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, pid: _Optional[int] = ..., client_pids: _Optional[_Iterable[int]] = ...) -> None: ...

class MpsDaemon(_message.Message):
    __slots__ = ("device_uuid", "up", "backend", "pid", "restarts", "default_thread_pct", "default_memory_limit_bytes", "detail", "pipe_dir", "servers", "defaults_drift_total")
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_THREAD_PCT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PIPE_DIR_FIELD_NUMBER: _ClassVar[int]
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    DEFAULTS_DRIFT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    up: bool
    backend: str
    pid: int
    restarts: int
    default_thread_pct: float
    default_memory_limit_bytes: int
    detail: str
    pipe_dir: str
    servers: _containers.RepeatedCompositeFieldContainer[MpsServer]
    defaults_drift_total: int
    def __init__(self, device_uuid: _Optional[str] = ..., up: _Optional[bool] = ..., backend: _Optional[str] = ..., pid: _Optional[int] = ..., restarts: _Optional[int] = ..., default_thread_pct: _Optional[float] = ..., default_memory_limit_bytes: _Optional[int] = ..., detail: _Optional[str] = ..., pipe_dir: _Optional[str] = ..., servers: _Optional[_Iterable[_Union[MpsServer, _Mapping]]] = ..., defaults_drift_total: _Optional[int] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("device_uuid", "taken_at", "counters")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    TAKEN_AT_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    taken_at: float
    counters: _containers.ScalarMap[str, float]
    def __init__(self, device_uuid: _Optional[str] = ..., taken_at: _Optional[float] = ..., counters: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ("device_uuid", "start_at", "window_s", "sample_count", "mean", "max")
    class MeanEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MaxEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    start_at: float
    window_s: float
    sample_count: int
    mean: _containers.ScalarMap[str, float]
    max: _containers.ScalarMap[str, float]
    def __init__(self, device_uuid: _Optional[str] = ..., start_at: _Optional[float] = ..., window_s: _Optional[float] = ..., sample_count: _Optional[int] = ..., mean: _Optional[_Mapping[str, float]] = ..., max: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetNodeResponse(_message.Message):
    __slots__ = ("node_name", "simulated", "agent_version", "taken_at", "devices", "mps", "latest_samples", "latest_windows", "telemetry_source", "stale_devices", "leases", "ledger", "stranded_memory_bytes", "stranded_thread_pct", "last_event_seq", "retention_estimates", "ineffective_ratio", "gone_devices", "injector")
    class RetentionEstimatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TAKEN_AT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    MPS_FIELD_NUMBER: _ClassVar[int]
    LATEST_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LATEST_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    STALE_DEVICES_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    STRANDED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STRANDED_THREAD_PCT_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    RETENTION_ESTIMATES_FIELD_NUMBER: _ClassVar[int]
    INEFFECTIVE_RATIO_FIELD_NUMBER: _ClassVar[int]
    GONE_DEVICES_FIELD_NUMBER: _ClassVar[int]
    INJECTOR_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    simulated: bool
    agent_version: str
    taken_at: float
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    mps: _containers.RepeatedCompositeFieldContainer[MpsDaemon]
    latest_samples: _containers.RepeatedCompositeFieldContainer[Sample]
    latest_windows: _containers.RepeatedCompositeFieldContainer[Window]
    telemetry_source: str
    stale_devices: _containers.RepeatedScalarFieldContainer[str]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    ledger: _containers.RepeatedCompositeFieldContainer[DeviceLedger]
    stranded_memory_bytes: int
    stranded_thread_pct: float
    last_event_seq: int
    retention_estimates: _containers.ScalarMap[str, float]
    ineffective_ratio: float
    gone_devices: _containers.RepeatedCompositeFieldContainer[GoneDevice]
    injector: str
    def __init__(self, node_name: _Optional[str] = ..., simulated: _Optional[bool] = ..., agent_version: _Optional[str] = ..., taken_at: _Optional[float] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., mps: _Optional[_Iterable[_Union[MpsDaemon, _Mapping]]] = ..., latest_samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., latest_windows: _Optional[_Iterable[_Union[Window, _Mapping]]] = ..., telemetry_source: _Optional[str] = ..., stale_devices: _Optional[_Iterable[str]] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., ledger: _Optional[_Iterable[_Union[DeviceLedger, _Mapping]]] = ..., stranded_memory_bytes: _Optional[int] = ..., stranded_thread_pct: _Optional[float] = ..., last_event_seq: _Optional[int] = ..., retention_estimates: _Optional[_Mapping[str, float]] = ..., ineffective_ratio: _Optional[float] = ..., gone_devices: _Optional[_Iterable[_Union[GoneDevice, _Mapping]]] = ..., injector: _Optional[str] = ...) -> None: ...

class GoneDevice(_message.Message):
    __slots__ = ("device_uuid", "since", "leases_failed", "when")
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    LEASES_FAILED_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    since: float
    leases_failed: int
    when: str
    def __init__(self, device_uuid: _Optional[str] = ..., since: _Optional[float] = ..., leases_failed: _Optional[int] = ..., when: _Optional[str] = ...) -> None: ...

class AnswerClaimRequest(_message.Message):
    __slots__ = ("claim_json",)
    CLAIM_JSON_FIELD_NUMBER: _ClassVar[int]
    claim_json: bytes
    def __init__(self, claim_json: _Optional[bytes] = ...) -> None: ...

class ShareAnswer(_message.Message):
    __slots__ = ("device", "share_id", "admitted", "reason", "message")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    device: str
    share_id: str
    admitted: bool
    reason: str
    message: str
    def __init__(self, device: _Optional[str] = ..., share_id: _Optional[str] = ..., admitted: _Optional[bool] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class AnswerClaimResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[ShareAnswer]
    def __init__(self, answers: _Optional[_Iterable[_Union[ShareAnswer, _Mapping]]] = ...) -> None: ...
