from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Device(_message.Message):
    __slots__ = ("uuid", "index", "model", "memory_bytes", "sharing_mode", "compute_capability", "parent_uuid", "mig_profile")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARING_MODE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    PARENT_UUID_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    model: str
    memory_bytes: int
    sharing_mode: str
    compute_capability: str
    parent_uuid: str
    mig_profile: str
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., model: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., sharing_mode: _Optional[str] = ..., compute_capability: _Optional[str] = ..., parent_uuid: _Optional[str] = ..., mig_profile: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("node_name", "simulated", "agent_version", "taken_at", "devices", "mps", "latest_samples", "latest_windows", "telemetry_source", "stale_devices")
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
    def __init__(self, node_name: _Optional[str] = ..., simulated: _Optional[bool] = ..., agent_version: _Optional[str] = ..., taken_at: _Optional[float] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., mps: _Optional[_Iterable[_Union[MpsDaemon, _Mapping]]] = ..., latest_samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., latest_windows: _Optional[_Iterable[_Union[Window, _Mapping]]] = ..., telemetry_source: _Optional[str] = ..., stale_devices: _Optional[_Iterable[str]] = ...) -> None: ...
