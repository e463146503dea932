"""The node's ResourceSlices: what the default scheduler allocates from. The pool is the
node (named by it), its devices the node's shared GPUs and MIG instances, cut into as many
slices as it takes of at most ``MAX_DEVICES`` each; every slice is owned by the Node object
so that it goes with the node.

:func:`slice_body` is a pure function of the devices, :func:`plan_pool` of the stored and
the wanted slices; :class:`SlicePublisher` keeps the API's slices of its pool equal to the
latest devices it was given: it writes only on a change, at most once per
``min_interval_s`` (a burst of changes becomes one write of the last state, one publish
event however many slices it writes), moves every slice of the pool to a new generation
with each change (consumers use only the newest generation, once they have all its
slices), deletes the pool's extra slices, and writes a slice again when it is gone (the
kubelet deletes a node's slices when it starts, and a driver's when none of its sockets
stayed connected for 30 s; the garbage collector deletes those of a Node object that was
deleted: the owner is read again before every slice created)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.kubeapi.port import Obj

log = logging.getLogger(__name__)

SLICE_API = "resource.k8s.io/v1"
MAX_DEVICES = 64  # per slice when devices carry taints or binding conditions
Attribute = str | int | bool


@dataclass(frozen=True, slots=True)
class Capacity:
    """A consumable capacity: its total, and the request policy the scheduler rounds
    requests by (a claim that asks nothing of it consumes ``default``)."""

    value: str  # a Kubernetes quantity
    default: str
    min: str | None = None  # validRange when set (with max and step)
    max: str | None = None
    step: str | None = None
    valid_values: tuple[str, ...] = ()  # validValues when set

    def json(self) -> Obj:
        policy: Obj = {"default": self.default}
        if self.valid_values:
            policy["validValues"] = list(self.valid_values)
        else:
            valid_range: Obj = {"min": self.min}
            if self.max is not None:
                valid_range["max"] = self.max
            if self.step is not None:
                valid_range["step"] = self.step
            policy["validRange"] = valid_range
        return {"value": self.value, "requestPolicy": policy}


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str  # NoSchedule | NoExecute | None
    value: str = ""
    time_added: str = ""  # RFC 3339, whole seconds; "" lets the API server set it

    def json(self) -> Obj:
        out: Obj = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        if self.time_added:
            out["timeAdded"] = self.time_added
        return out


@dataclass(frozen=True, slots=True)
class SliceDevice:
    name: str
    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    version_attributes: Mapping[str, str] = field(default_factory=dict)  # semver strings
    capacity: Mapping[str, Capacity] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()

    def json(self) -> Obj:
        attributes: Obj = {k: {_kind(v): v} for k, v in sorted(self.attributes.items())}
        attributes.update({k: {"version": v} for k, v in sorted(self.version_attributes.items())})
        out: Obj = {
            "name": self.name,
            "allowMultipleAllocations": True,
            "attributes": attributes,
            "capacity": {k: c.json() for k, c in sorted(self.capacity.items())},
        }
        if self.taints:
            out["taints"] = [t.json() for t in self.taints]
        if self.binding_conditions:
            out["bindsToNode"] = True
            out["bindingConditions"] = list(self.binding_conditions)
            out["bindingFailureConditions"] = list(self.binding_failure_conditions)
        return out


def _kind(value: Attribute) -> str:
    if isinstance(value, bool):
        return "bool"
    return "int" if isinstance(value, int) else "string"


def chunks_of(devices: Sequence[SliceDevice]) -> list[tuple[SliceDevice, ...]]:
    """The pool's devices, in their order, cut into slices of at most ``MAX_DEVICES`` (one
    empty slice when there are none: the pool still says it has no devices)."""
    return [tuple(devices[i : i + MAX_DEVICES]) for i in range(0, len(devices), MAX_DEVICES)] or [
        ()
    ]


def slice_body(
    driver: str,
    node: str,
    node_uid: str,
    devices: Sequence[SliceDevice],
    generation: int,
    count: int = 1,
) -> Obj:
    """One of the ``count`` ResourceSlices of the node's pool (without name:
    ``generateName`` picks it)."""
    if len(devices) > MAX_DEVICES:
        raise ValueError(f"{len(devices)} devices: a slice holds at most {MAX_DEVICES}")
    metadata: Obj = {"generateName": f"{node}-{driver}-"}
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": SLICE_API,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": [d.json() for d in devices],
        },
    }


def comparable(slice_obj: Obj) -> list[Any]:
    devices = ((slice_obj.get("spec") or {}).get("devices")) or []
    out = []
    for device in devices:
        copy = dict(device)
        if "taints" in copy:
            copy["taints"] = [
                {k: v for k, v in t.items() if k != "timeAdded"} for t in copy["taints"]
            ]
        out.append(copy)
    return out


def generation_of(slice_obj: Obj) -> int:
    pool = (slice_obj.get("spec") or {}).get("pool") or {}
    try:
        return int(pool.get("generation") or 0)
    except (TypeError, ValueError):
        return 0


TaintTimes = Mapping[tuple[str, str, str, str], str]  # (device, key, value, effect) -> time


def taint_times(slices: Iterable[Obj]) -> TaintTimes:
    """The ``timeAdded`` of each stored taint."""
    return {
        _taint_id(device, taint): str(taint["timeAdded"])
        for found in slices
        for device in devices_of(found)
        for taint in device.get("taints") or []
        if taint.get("timeAdded")
    }


def keep_taint_times(body: Obj, times: TaintTimes) -> Obj:
    """``body`` with each of its untimed taints given the time it is stored with, if it
    is: a taint stays as old as it is when its slice is written again (a ``NoExecute``
    toleration's seconds count from it), rather than timed anew by the API server."""
    for device in devices_of(body):
        for taint in device.get("taints") or []:
            stored = times.get(_taint_id(device, taint))
            if stored and not taint.get("timeAdded"):
                taint["timeAdded"] = stored
    return body


def _taint_id(device: Obj, taint: Obj) -> tuple[str, str, str, str]:
    key, value, effect = (str(taint.get(k) or "") for k in ("key", "value", "effect"))
    return str(device.get("name")), key, value, effect


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """The writes that make the API's slices of a pool the wanted ones: the generation
    they carry, each wanted slice (by index) written over a stored one or created
    (``None``), and the stored slices deleted."""

    generation: int
    writes: tuple[tuple[int, Obj | None], ...] = ()
    deletes: tuple[Obj, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.writes and not self.deletes

    @property
    def creates(self) -> bool:
        return any(keep is None for _, keep in self.writes)


Fits = Callable[[Obj, int], bool]  # does a stored slice publish the wanted slice of index i?


def plan_pool(
    stored: Sequence[Obj], wanted: Sequence[list[str]], fits: Fits, next_generation: int
) -> PoolPlan:
    """What to write so that the pool's newest generation is the ``wanted`` slices (their
    device names; ``fits`` compares contents). While every slice of the newest generation
    is one of the wanted ones, that generation is completed (a slice wiped, or a write that
    failed half way); otherwise all wanted slices are written at ``next_generation`` (a
    consumer uses only the newest generation's slices, and only once it has all of them).
    Stored slices are written over rather than created and deleted, one holding the same
    devices first; those left over are deleted."""
    highest = max((generation_of(s) for s in stored), default=0)
    current = [s for s in stored if generation_of(s) == highest]
    held: dict[int, Obj] = {}
    for found in current:
        index = next((i for i in range(len(wanted)) if i not in held and fits(found, i)), None)
        if index is not None:
            held[index] = found
    if not current or any(not any(fits(s, i) for i in range(len(wanted))) for s in current):
        highest, held = next_generation, {}
    leftovers = sorted((s for s in stored if not _among(s, held.values())), key=name_of)
    writes = tuple((i, _reuse(leftovers, names)) for i, names in enumerate(wanted) if i not in held)
    return PoolPlan(highest, writes, tuple(leftovers))


def _among(found: Obj, others: Iterable[Obj]) -> bool:
    return any(found is other for other in others)


def _reuse(leftovers: list[Obj], names: list[str]) -> Obj | None:
    """A stored slice to write over (taken from ``leftovers``): one of the same devices if
    there is one."""
    if not leftovers:
        return None
    chosen = next((s for s in leftovers if device_names(s) == names), leftovers[0])
    leftovers[:] = [s for s in leftovers if s is not chosen]
    return chosen


def comparable_key(comparable: list[Any]) -> str:
    return json.dumps(comparable, sort_keys=True)


def key_of(body: Obj) -> str:
    return comparable_key(comparable(body))


def pool_of(slice_obj: Obj) -> str:
    return str(((slice_obj.get("spec") or {}).get("pool") or {}).get("name") or "")


def slice_count(slice_obj: Obj) -> int:
    pool = (slice_obj.get("spec") or {}).get("pool") or {}
    count = pool.get("resourceSliceCount")
    return count if isinstance(count, int) else 0


def devices_of(slice_obj: Obj) -> list[Obj]:
    return list((slice_obj.get("spec") or {}).get("devices") or [])


def device_names(slice_obj: Obj) -> list[str]:
    return [str(d.get("name")) for d in devices_of(slice_obj)]


def owner_of(slice_obj: Obj) -> str:
    owners = (slice_obj.get("metadata") or {}).get("ownerReferences") or []
    return next((str(o.get("uid") or "") for o in owners if o.get("kind") == "Node"), "")


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def uid_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def identity_of(obj: Obj) -> dict[str, Any]:
    """What a replace keeps of the stored slice: not its owner (the body names the Node
    as it is now)."""
    meta = obj.get("metadata") or {}
    keys = ("name", "uid", "resourceVersion")
    return {k: meta[k] for k in keys if k in meta}
