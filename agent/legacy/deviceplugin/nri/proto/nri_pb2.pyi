from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterPluginRequest(_message.Message):
    __slots__ = ("plugin_name", "plugin_idx")
    PLUGIN_NAME_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_IDX_FIELD_NUMBER: _ClassVar[int]
    plugin_name: str
    plugin_idx: str
    def __init__(self, plugin_name: _Optional[str] = ..., plugin_idx: _Optional[str] = ...) -> None: ...

class ConfigureRequest(_message.Message):
    __slots__ = ("config", "runtime_name", "runtime_version", "registration_timeout", "request_timeout")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_NAME_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    config: str
    runtime_name: str
    runtime_version: str
    registration_timeout: int
    request_timeout: int
    def __init__(self, config: _Optional[str] = ..., runtime_name: _Optional[str] = ..., runtime_version: _Optional[str] = ..., registration_timeout: _Optional[int] = ..., request_timeout: _Optional[int] = ...) -> None: ...

class ConfigureResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: int
    def __init__(self, events: _Optional[int] = ...) -> None: ...

class SynchronizeRequest(_message.Message):
    __slots__ = ("pods", "containers", "more")
    PODS_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    pods: _containers.RepeatedCompositeFieldContainer[PodSandbox]
    containers: _containers.RepeatedCompositeFieldContainer[Container]
    more: bool
    def __init__(self, pods: _Optional[_Iterable[_Union[PodSandbox, _Mapping]]] = ..., containers: _Optional[_Iterable[_Union[Container, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class SynchronizeResponse(_message.Message):
    __slots__ = ("update", "more")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    update: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    more: bool
    def __init__(self, update: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class CreateContainerRequest(_message.Message):
    __slots__ = ("pod", "container")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class CreateContainerResponse(_message.Message):
    __slots__ = ("adjust", "update", "evict")
    ADJUST_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    adjust: ContainerAdjustment
    update: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    evict: _containers.RepeatedCompositeFieldContainer[ContainerEviction]
    def __init__(self, adjust: _Optional[_Union[ContainerAdjustment, _Mapping]] = ..., update: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ..., evict: _Optional[_Iterable[_Union[ContainerEviction, _Mapping]]] = ...) -> None: ...

class StateChangeEvent(_message.Message):
    __slots__ = ("event", "pod", "container")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    event: int
    pod: PodSandbox
    container: Container
    def __init__(self, event: _Optional[int] = ..., pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class PodSandbox(_message.Message):
    __slots__ = ("id", "name", "uid", "namespace", "labels", "annotations")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    uid: str
    namespace: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ..., namespace: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("id", "pod_sandbox_id", "name", "state", "labels", "annotations", "args", "env")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    id: str
    pod_sandbox_id: str
    name: str
    state: int
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., pod_sandbox_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., args: _Optional[_Iterable[str]] = ..., env: _Optional[_Iterable[str]] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("destination", "type", "source", "options")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    destination: str
    type: str
    source: str
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, destination: _Optional[str] = ..., type: _Optional[str] = ..., source: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ...) -> None: ...

class ContainerAdjustment(_message.Message):
    __slots__ = ("annotations", "mounts", "env")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    annotations: _containers.ScalarMap[str, str]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    env: _containers.RepeatedCompositeFieldContainer[KeyValue]
    def __init__(self, annotations: _Optional[_Mapping[str, str]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., env: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ...) -> None: ...

class ContainerUpdate(_message.Message):
    __slots__ = ("container_id", "ignore_failure")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    IGNORE_FAILURE_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    ignore_failure: bool
    def __init__(self, container_id: _Optional[str] = ..., ignore_failure: _Optional[bool] = ...) -> None: ...

class ContainerEviction(_message.Message):
    __slots__ = ("container_id", "reason")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    reason: str
    def __init__(self, container_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
