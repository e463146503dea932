"""The node's ResourceSlice: what the default scheduler allocates from. One slice per node
(the pool is the node, its devices are the node's shared GPUs and MIG instances), owned by
the Node object so that it goes with the node.

:func:`slice_body` is a pure function of the devices; :class:`SlicePublisher` keeps the
API's copy equal to the latest devices it was given: it writes only on a change, at most
once per ``min_interval_s`` (a burst of changes becomes one write of the last state),
bumps the pool's generation with every write, deletes any other slice of its pool, and
writes again when the slice is gone (the kubelet deletes a node's slices when it starts,
and a driver's when none of its sockets stayed connected for 30 s)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.kubeapi.port import Conflict, KubeError, NotFound, Obj, ResourceApi

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


def slice_body(
    driver: str, node: str, node_uid: str, devices: Sequence[SliceDevice], generation: int
) -> Obj:
    """The node's one ResourceSlice (without name: ``generateName`` picks it)."""
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
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [d.json() for d in devices],
        },
    }


def same_devices(stored: Obj, desired: Obj) -> bool:
    """Do two slices publish the same devices (taints' times aside when one is unset: the
    API server fills them in)?"""
    return _comparable(stored) == _comparable(desired)


def _comparable(slice_obj: Obj) -> list[Any]:
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


class SlicePublisher:
    """Keeps the node's slice equal to the devices last given to :meth:`publish`."""

    def __init__(
        self,
        api: ResourceApi,
        *,
        driver: str,
        node: str,
        min_interval_s: float = 1.0,
        resync_s: float = 30.0,
        backoff_max_s: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._api = api
        self.driver = driver
        self.node = node
        self._min_interval_s = min_interval_s
        self._resync_s = resync_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._desired: tuple[SliceDevice, ...] | None = None
        self._changed = asyncio.Event()
        self._node_uid = ""
        self.writes = 0  # creates, replaces and deletes sent
        self.generation = 0
        self._accepted: tuple[tuple[SliceDevice, ...], list[Any]] | None = None
        self.dropped: list[str] = []  # device fields the server did not keep (logged once)
        self.synced = asyncio.Event()  # set once the API holds the latest devices

    def publish(self, devices: Sequence[SliceDevice]) -> None:
        """Ask for these devices to be published; returns at once (no I/O)."""
        desired = tuple(devices)
        if desired != self._desired:
            self._desired = desired
            self.synced.clear()
            self._changed.set()

    async def run(self) -> None:
        """Publish until cancelled: after each change, and every ``resync_s`` (the slice
        may have been deleted under us)."""
        failures = 0
        last_write = -self._min_interval_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self._resync_s)
            wait_s = last_write + self._min_interval_s - self._clock()
            if wait_s > 0:
                await asyncio.sleep(wait_s)  # coalesce: what changes meanwhile goes too
            self._changed.clear()
            try:
                if await self.sync_once():
                    last_write = self._clock()
                failures = 0
            except (KubeError, OSError) as exc:
                failures += 1
                delay_s = min(self._backoff_max_s, self._min_interval_s * 2.0**failures)
                log.warning(
                    "publishing the ResourceSlice failed (%s); again in %.1fs", exc, delay_s
                )
                self._changed.set()
                await asyncio.sleep(delay_s)

    async def sync_once(self) -> bool:
        """One comparison with the API and the writes it calls for; True if it wrote."""
        if self._desired is None:
            return False
        desired = self._desired
        if not self._node_uid:
            self._node_uid = await self._owner_uid()
        listing = await self._api.list_resource_slices(
            field_selector=f"spec.nodeName={self.node},spec.driver={self.driver}"
        )
        mine = [s for s in listing.items if _pool_of(s) == self.node]
        highest = max((generation_of(s) for s in mine), default=0)
        self.generation = max(self.generation, highest)
        body = slice_body(self.driver, self.node, self._node_uid, desired, self.generation)
        keep = next((s for s in mine if generation_of(s) == highest), None)
        wrote = await self._delete_others(mine, keep)
        if keep is not None and _counted_one(keep) and self._unchanged(keep, body, desired):
            self._synced_if(desired)
            return wrote
        stored = await self._write(keep, body)
        self._accepted = (desired, _comparable(stored))
        if _comparable(stored) != _comparable(body):
            self._note_dropped(body, stored)
        self._synced_if(desired)
        return True

    def _unchanged(self, keep: Obj, body: Obj, desired: tuple[SliceDevice, ...]) -> bool:
        """The stored slice already publishes ``desired``: the same devices, or what the
        server kept of them when it was last written (fields it drops, such as binding
        conditions or taints on a cluster without their feature gates, are not written
        again and again)."""
        if same_devices(keep, body):
            return True
        accepted = self._accepted
        return accepted is not None and accepted[0] == desired and _comparable(keep) == accepted[1]

    def _note_dropped(self, body: Obj, stored: Obj) -> None:
        sent = {k for d in (body["spec"].get("devices") or []) for k in d}
        kept = {k for d in ((stored.get("spec") or {}).get("devices") or []) for k in d}
        dropped = sorted(sent - kept) or ["some values"]
        if dropped != self.dropped:
            self.dropped = dropped
            log.warning(
                "the API server dropped %s of the published devices (feature gates off?): "
                "the scheduler does not see them",
                ", ".join(dropped),
            )

    async def _write(self, keep: Obj | None, body: Obj) -> Obj:
        """Create or replace the slice; the object as the server stored it."""
        self.generation += 1
        body["spec"]["pool"]["generation"] = self.generation
        self.writes += 1
        if keep is None:
            created = await self._api.create_resource_slice(body)
            log.info("published ResourceSlice %s (generation %d)", _name(created), self.generation)
            return created
        body["metadata"] = {**body["metadata"], **_identity(keep)}
        del body["metadata"]["generateName"]
        try:
            stored = await self._api.replace_resource_slice(_name(keep), body)
        except Conflict:
            self._changed.set()  # changed under us: compare again at once
            raise
        log.info("updated ResourceSlice %s (generation %d)", _name(keep), self.generation)
        return stored

    async def _delete_others(self, mine: list[Obj], keep: Obj | None) -> bool:
        wrote = False
        for other in mine:
            if other is keep:
                continue
            self.writes += 1
            wrote = True
            with contextlib.suppress(NotFound):
                await self._api.delete_resource_slice(_name(other), uid=_uid(other))
        return wrote

    async def _owner_uid(self) -> str:
        try:
            node = await self._api.get_node(self.node)
        except NotFound:
            log.warning("node %s not found: its ResourceSlice has no owner", self.node)
            return ""
        return str((node.get("metadata") or {}).get("uid") or "")

    def _synced_if(self, desired: tuple[SliceDevice, ...]) -> None:
        if desired == self._desired:
            self.synced.set()


def _pool_of(slice_obj: Obj) -> str:
    return str(((slice_obj.get("spec") or {}).get("pool") or {}).get("name") or "")


def _counted_one(slice_obj: Obj) -> bool:
    pool = (slice_obj.get("spec") or {}).get("pool") or {}
    return pool.get("resourceSliceCount") == 1


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _identity(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    keys = ("name", "uid", "resourceVersion", "ownerReferences")
    return {k: meta[k] for k in keys if k in meta}
