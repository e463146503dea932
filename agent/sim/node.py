"""Describe a simulated node in YAML and build its devices.

    version: 1
    devices:
      - model: H100-SXM5-80GB
        memory: 80GiB
        count: 2                 # optional, default 1
        sharing_mode: mps        # optional: mps (default) or exclusive
        compute_capability: "9.0"
        minor: [1, 0]            # optional: each GPU's /dev/nvidia<minor> (default its
                                 # index); a number: the first GPU's, the next counting on
      - model: A100-SXM4-80GB
        memory: 80GiB
        mig:                     # optional: the GPU is in MIG mode; each instance is a device
          - {profile: 3g.40gb, memory: 40GiB}
          - {profile: 3g.40gb, memory: 40GiB}

With no file the node has 4 x H100 80GB. Errors name the offending path
(``devices[1].mig[0].memory``). GPUs are indexed in the order listed; a MIG instance has
its GPU's minor number, GPU instance ids 1, 2, ... and compute instance id 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from agent.core.errors import SimulationError, UnitError
from agent.core.types import Device, SharingMode
from agent.core.units import GIB, parse_bytes
from agent.gpu.fake import fake_uuid

DEFAULT_MODEL = "H100-SXM5-80GB"
DEFAULT_GPU_COUNT = 4
_GPU_KEYS = {"model", "memory", "count", "sharing_mode", "compute_capability", "mig", "minor"}
MAX_MINOR = 254  # /dev/nvidia255 is nvidiactl
_MIG_KEYS = {"profile", "memory"}


@dataclass(frozen=True, slots=True)
class SimNodeSpec:
    devices: tuple[Device, ...]

    @classmethod
    def default(cls) -> SimNodeSpec:
        return cls(tuple(_gpus(DEFAULT_MODEL, 80 * GIB, DEFAULT_GPU_COUNT, start=0)))


def parse_sim_node(text: str, *, source: str = "node file") -> SimNodeSpec:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SimulationError(f"{source} is not valid YAML: {exc}") from exc
    if not isinstance(document, dict):
        raise SimulationError(f"{source}: must be a mapping with 'version' and 'devices'")
    if type(document.get("version")) is not int or document.get("version") != 1:
        raise SimulationError(f"{source}: version must be 1 (found {document.get('version')!r})")
    unknown = set(document) - {"version", "devices"}
    if unknown:
        raise SimulationError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    entries = document.get("devices")
    if not isinstance(entries, list) or not entries:
        raise SimulationError(f"{source}: devices must be a non-empty list")
    devices: list[Device] = []
    gpu_count = 0
    minors: dict[int, str] = {}  # minor number -> the entry that has it
    for position, entry in enumerate(entries):
        path = f"devices[{position}]"
        entry_devices, entry_gpus = _entry_devices(entry, path, gpu_count)
        for minor in dict.fromkeys(d.minor for d in entry_devices if d.minor is not None):
            if minor in minors:
                raise SimulationError(f"{path}.minor: {minor} is {minors[minor]}'s already")
            minors[minor] = path
        devices.extend(entry_devices)
        gpu_count += entry_gpus
    return SimNodeSpec(tuple(devices))


def _entry_devices(entry: Any, path: str, gpu_index: int) -> tuple[list[Device], int]:
    """The devices of one entry, and how many physical GPUs it describes."""
    body = _mapping(entry, path, _GPU_KEYS)
    model = _text(body, "model", path)
    memory_bytes = _size(body, "memory", path)
    count = body.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 64:
        raise SimulationError(f"{path}.count: must be a whole number from 1 to 64")
    mode = _sharing_mode(body.get("sharing_mode", "mps"), f"{path}.sharing_mode")
    capability = _capability(body.get("compute_capability", "9.0"), path)
    minors = _minors(body.get("minor"), count, gpu_index, f"{path}.minor")
    gpus = _gpus(
        model, memory_bytes, count, start=gpu_index, mode=mode, capability=capability, minors=minors
    )
    if "mig" not in body:
        return gpus, count
    return [m for gpu in gpus for m in _mig_devices(gpu, body["mig"], f"{path}.mig")], count


def _gpus(
    model: str,
    memory_bytes: int,
    count: int,
    *,
    start: int,
    mode: SharingMode = SharingMode.MPS,
    capability: tuple[int, int] = (9, 0),
    minors: list[int] | None = None,
) -> list[Device]:
    return [
        Device(
            uuid=fake_uuid("GPU", "sim", start + i),
            index=start + i,
            model=model,
            memory_bytes=memory_bytes,
            sharing_mode=mode,
            compute_capability=capability,
            minor=start + i if minors is None else minors[i],
        )
        for i in range(count)
    ]


def _minors(value: Any, count: int, start: int, path: str) -> list[int]:
    """The entry's GPUs' minor numbers: a list of one each, or the first of a run; none
    given, their indexes."""
    if value is None:
        numbers = [start + i for i in range(count)]
    elif isinstance(value, int) and not isinstance(value, bool):
        numbers = [value + i for i in range(count)]
    elif isinstance(value, list) and len(value) == count:
        numbers = value
    else:
        raise SimulationError(f"{path}: a number, or a list of {count} numbers (one a GPU)")
    for number in numbers:
        if not isinstance(number, int) or isinstance(number, bool):
            raise SimulationError(f"{path}: {number!r} is not a whole number")
        if not 0 <= number <= MAX_MINOR:
            raise SimulationError(f"{path}: {number} is not from 0 to {MAX_MINOR}")
    if len(set(numbers)) != len(numbers):
        raise SimulationError(f"{path}: a minor number is given twice")
    return numbers


def _mig_devices(gpu: Device, instances: Any, path: str) -> list[Device]:
    if not isinstance(instances, list) or not instances:
        raise SimulationError(f"{path}: must be a non-empty list of instances")
    devices = []
    total = 0
    for position, instance in enumerate(instances):
        body = _mapping(instance, f"{path}[{position}]", _MIG_KEYS)
        memory_bytes = _size(body, "memory", f"{path}[{position}]")
        total += memory_bytes
        devices.append(
            Device(
                uuid=fake_uuid("MIG", gpu.uuid, position),
                index=gpu.index,
                model=gpu.model,
                memory_bytes=memory_bytes,
                sharing_mode=gpu.sharing_mode,
                compute_capability=gpu.compute_capability,
                parent_uuid=gpu.uuid,
                mig_profile=_text(body, "profile", f"{path}[{position}]"),
                gpu_instance_id=position + 1,
                minor=gpu.minor,
                compute_instance_id=0,
            )
        )
    if total > gpu.memory_bytes:
        raise SimulationError(f"{path}: instances hold more memory than the GPU has")
    return devices


def _mapping(entry: Any, path: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(entry, dict):
        raise SimulationError(f"{path}: must be a mapping")
    unknown = set(entry) - allowed
    if unknown:
        raise SimulationError(f"{path}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    return entry


def _text(body: Mapping[str, Any], key: str, path: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value.strip():
        raise SimulationError(f"{path}.{key}: required, a non-empty string")
    return value


def _size(body: Mapping[str, Any], key: str, path: str) -> int:
    value = body.get(key)
    if value is None:
        raise SimulationError(f"{path}.{key}: required (for example 80GiB)")
    try:
        size = parse_bytes(str(value))
    except UnitError as exc:
        raise SimulationError(f"{path}.{key}: {exc}") from exc
    if size <= 0:
        raise SimulationError(f"{path}.{key}: must be more than 0")
    return size


def _sharing_mode(value: Any, path: str) -> SharingMode:
    try:
        return SharingMode(value)
    except ValueError:
        raise SimulationError(f"{path}: must be 'mps' or 'exclusive' (got {value!r})") from None


def _capability(value: Any, path: str) -> tuple[int, int]:
    major, _, minor = str(value).partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise SimulationError(f"{path}.compute_capability: must look like '9.0' (got {value!r})")
    return int(major), int(minor)
