"""What the node publishes as a DRA driver, from what its ledger sees: one device per
shared GPU or MIG instance, its consumable capacities, the attributes a CEL selector can
ask for, taints (``NoSchedule`` for devices closed to new shares or refused a share at
their binding a moment ago, ``NoExecute`` for a GPU that is gone), and the devices'
health. Pure: the same views (and clocks) give the same devices in the same order (so an
unchanged node writes nothing).

Memory and clients agree with the ledger by construction: ``memory`` is the device's memory
less the reserve and a CUDA context overhead for each of the ``clients`` a device may take,
so any set of shares the scheduler fits on a device fits the ledger's memory and client cap.
What the slice cannot say (the guaranteed-thread budget, the trust domain, the retention
gate) the agent says at the binding answer, and again at Prepare."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from agent.admission.isolation import isolation_of
from agent.admission.policy import DeviceView, Rules
from agent.config.dra import DraSettings
from agent.core.quantity import binary_quantity
from agent.core.types import Device, ReasonCode
from agent.core.units import MIB, parse_bytes
from agent.dra.claims import ADMITTED, REFUSED
from agent.dra.port import DeviceHealth, Health
from agent.dra.slices import Capacity, SliceDevice, Taint
from agent.node.availability import FAULT_EVENTS, GONE_DETAIL, LOST_DETAIL

MIN_SHARE_BYTES = 256 * MIB
QUIET_THREADS_PCT = 50.0  # at most this much compute committed: "quiet"
TAINT_OF_REASON = {
    ReasonCode.DRAINING: "gpushare.io/drained",
    ReasonCode.DEVICE_DEGRADED: "gpushare.io/degraded",
    ReasonCode.DEVICE_UNAVAILABLE: "gpushare.io/mps-down",
}
FAULT_TAINT = "gpushare.io/fault"  # any other closure: a fault, the store failing closed
GONE_TAINT = "gpushare.io/gone"  # NoExecute: the pods using the device are evicted
REFUSED_TAINT = "gpushare.io/refused"  # NoSchedule for dra.refusal_backoff_s after a refusal
LOST_XIDS = frozenset({79})  # XID 79: the GPU has fallen off the bus
# the janitor's closure for NVML's critical XID event ("<kind>: <NVML's message>")
XID_DETAIL = re.compile(r"gpu\.xid: .*\bdata (?P<xid>\d+)$")
NO_REFUSALS: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Inventory:
    devices: tuple[SliceDevice, ...]
    uuid_of: Mapping[str, str]  # published device name -> device UUID
    name_of: Mapping[str, str]  # device UUID -> published device name


def device_name(device: Device, by_uuid: Mapping[str, Device]) -> str:
    """``gpu-<index>``; a MIG instance ``gpu-<parent index>-mig-<GPU instance id>``."""
    if device.parent_uuid is None or device.gpu_instance_id is None:
        return f"gpu-{device.index}"
    parent = by_uuid.get(device.parent_uuid)
    parent_index = parent.index if parent is not None else device.index
    return f"gpu-{parent_index}-mig-{device.gpu_instance_id}"


def clients_of(device: Device, rules: Rules, dra: DraSettings) -> int:
    """How many shares a device takes at most: ``dra.clients_per_device``, fewer where its
    memory cannot give each a context and the smallest share (a small MIG instance)."""
    per_share = rules.context_overhead_bytes + MIN_SHARE_BYTES
    fits = (device.memory_bytes - rules.reserve_bytes) // per_share
    return max(0, min(dra.clients_per_device, fits))


def memory_capacity_bytes(device: Device, rules: Rules, clients: int) -> int:
    """What the shares of one device may take in all, whole MiB."""
    free = device.memory_bytes - rules.reserve_bytes - rules.context_overhead_bytes * clients
    return max(0, free // MIB * MIB)


@functools.lru_cache(maxsize=256)  # a node's few devices under its one set of settings
def capacities(device: Device, rules: Rules, dra: DraSettings) -> Mapping[str, Capacity] | None:
    """The device's consumable capacities; None when it cannot hold even one share (its
    request policies need a range of at least two values: the smallest share and one
    MiB more)."""
    clients = clients_of(device, rules, dra)
    memory_bytes = memory_capacity_bytes(device, rules, clients)
    if clients < 1 or memory_bytes < MIN_SHARE_BYTES + MIB:
        return None
    default_memory = min(parse_bytes(dra.default_memory) // MIB * MIB, memory_bytes)
    default_memory = max(default_memory, MIN_SHARE_BYTES)
    return {
        "memory": Capacity(
            value=binary_quantity(memory_bytes),
            default=binary_quantity(default_memory),
            min=binary_quantity(MIN_SHARE_BYTES),
            max=binary_quantity(memory_bytes),
            step="1Mi",
        ),
        "threads": thread_capacity(rules, dra),
        "clients": Capacity(value=str(clients), default="1", valid_values=("1",)),
    }


def thread_capacity(rules: Rules, dra: DraSettings) -> Capacity:
    """Thread percentages add up to the thread budget, at most 100 a share."""
    total = max(1, int(rules.thread_budget_pct))
    default = str(min(dra.default_thread_pct, 100, total))
    if total == 1:  # a range needs min + step <= value: one value only
        return Capacity(value="1", default="1", valid_values=("1",))
    return Capacity(value=str(total), default=default, min="1", max=str(min(100, total)), step="1")


def gone_why(view: DeviceView) -> str:
    """Why the GPU is gone, as a taint value; "" while it is not. Gone: no longer listed by
    the GPU backend (the janitor's presence check: off the bus, MIG repartitioned), or an
    NVML event that says the GPU is lost (XID 79). Not gone: drained, degraded, its MPS
    daemon down, any other fault (the GPU is there; its pods may run on)."""
    if view.closed is not ReasonCode.DEVICE_UNAVAILABLE:
        return ""
    if view.closed_detail == GONE_DETAIL:
        return "not-listed"
    if view.closed_detail == LOST_DETAIL:
        return "lost"
    xid = XID_DETAIL.match(view.closed_detail)
    return f"xid-{xid['xid']}" if xid and int(xid["xid"]) in LOST_XIDS else ""


def taints(view: DeviceView, refused_at: str | None = None) -> tuple[Taint, ...]:
    """A ``NoSchedule`` taint saying why a device is closed to new shares; ``NoExecute``
    (KEP-5055: the eviction controller evicts the pods whose claims use it) for a GPU that
    is gone; and, while ``refused_at`` is given (the time of a refusal at the binding,
    RFC 3339, or "" for the API server to time it), ``gpushare.io/refused``."""
    out = [_closed_taint(view, view.closed)] if view.closed is not None else []
    if refused_at is not None:
        out.append(Taint(REFUSED_TAINT, "NoSchedule", time_added=refused_at))
    return tuple(out)


def _closed_taint(view: DeviceView, closed: ReasonCode) -> Taint:
    gone = gone_why(view)
    if gone:
        return Taint(GONE_TAINT, "NoExecute", gone)
    key = TAINT_OF_REASON.get(closed, FAULT_TAINT)
    if any(view.closed_detail.startswith(f"{kind}: ") for kind in FAULT_EVENTS):
        key = FAULT_TAINT  # closed by the janitor for a fault, not for its daemon
    return Taint(key, "NoSchedule", closed.value.lower())


def refused_at(
    deadline_s: float | None, now_s: float, backoff_s: float, wall_s: float | None
) -> str | None:
    """While a refused device's back-off lasts (``now_s`` before its monotonic
    ``deadline_s``), the wall-clock time of the refusal (RFC 3339, whole seconds; "" without
    ``wall_s``, the wall clock at ``now_s``); None once it is over."""
    if deadline_s is None or now_s >= deadline_s:
        return None
    if wall_s is None:
        return ""
    at_s = wall_s - (now_s - (deadline_s - backoff_s))
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at_s))


def headroom(view: DeviceView) -> str:
    if view.closed is ReasonCode.DEVICE_DEGRADED:
        return "degraded"
    return "quiet" if view.threads_committed_pct <= QUIET_THREADS_PCT else "busy"


FloorOf = Callable[[str | None, float | None], float | None]  # (profile, stated) -> floor


def stated_floor(_profile: str | None, stated: float | None) -> float | None:
    return stated


def attributes(view: DeviceView, floor_of: FloorOf = stated_floor) -> dict[str, str | int | bool]:
    device, isolation = view.device, isolation_of(view.device)
    domains = view.domains if view.domains is not None else {x.trust_domain for x in view.leases}
    return {
        "uuid": device.uuid,
        "index": device.index,
        "productName": device.model,
        "memoryBytes": device.memory_bytes,
        "sharingMode": device.sharing_mode.value,
        "isolationMemory": isolation.memory.value,
        "isolationFaults": isolation.faults.value,
        "isolationCompute": isolation.compute.value,
        "trustDomain": next(iter(domains)) if len(domains) == 1 else "",
        "protected": any(floor_of(x.profile, x.retention_floor) for x in view.leases),
        "retentionHeadroom": headroom(view),
    }


def inventory(
    views: Sequence[DeviceView],
    rules: Rules,
    dra: DraSettings,
    floor_of: FloorOf = stated_floor,
    *,
    refused_until: Mapping[str, float] = NO_REFUSALS,
    now_s: float = 0.0,
    wall_s: float | None = None,
) -> Inventory:
    """What to publish, in one order whatever the views' (by GPU index, then MIG
    instance): an unchanged node writes nothing. ``floor_of`` says which leases have a
    retention floor (stated, or their profile's): a device with one is ``protected``.

    ``refused_until`` (published device name -> monotonic deadline) names the devices the
    agent refused a share on at its binding: until the deadline (``now_s`` is the monotonic
    clock now, ``wall_s`` the wall clock then, for the taint's ``timeAdded``) each carries a
    ``NoSchedule`` taint ``gpushare.io/refused``, so that the scheduler does not pick it
    again at once (KEP-5007 asks a driver that fails a binding to keep the device from
    being picked again; KEP-5055: a claim needs a toleration to be allocated a device with
    a NoSchedule taint). What it costs: every new claim, not only the refused one's, skips
    the device for the back-off (``dra.refusal_backoff_s``, short for that reason), and
    the node's slices are written when the taint comes and again when it goes."""
    by_uuid = {v.device.uuid: v.device for v in views}
    devices, uuid_of = [], {}
    for view in sorted(views, key=lambda v: _order(v.device)):
        capacity = capacities(view.device, rules, dra)
        if capacity is None:
            continue
        name = device_name(view.device, by_uuid)
        refused = refused_at(refused_until.get(name), now_s, dra.refusal_backoff_s, wall_s)
        tainted = taints(view, refused)
        devices.append(slice_device(name, view, capacity, tainted, dra, floor_of))
        uuid_of[name] = view.device.uuid
    return Inventory(tuple(devices), uuid_of, {u: n for n, u in uuid_of.items()})


def _order(device: Device) -> tuple[int, int, str]:
    """A MIG instance has its GPU's index: its GPU instance id tells it from its siblings."""
    return device.index, device.gpu_instance_id or 0, device.uuid


def slice_device(
    name: str,
    view: DeviceView,
    capacity: Mapping[str, Capacity],
    tainted: tuple[Taint, ...],
    dra: DraSettings,
    floor_of: FloorOf,
) -> SliceDevice:
    major, minor = view.device.compute_capability
    conditions = ((ADMITTED,), (REFUSED,)) if dra.binding_conditions else ((), ())
    return SliceDevice(
        name=name,
        attributes=attributes(view, floor_of),
        version_attributes={"computeCapability": f"{major}.{minor}.0"},
        capacity=capacity,
        taints=tainted,
        binding_conditions=conditions[0],
        binding_failure_conditions=conditions[1],
    )


def device_health(
    views: Sequence[DeviceView], pool: str, names: Mapping[str, str]
) -> list[DeviceHealth]:
    """Unhealthy while the device's MPS daemon is down or it is closed by a fault;
    drained and degraded devices are healthy (their taints steer new shares away)."""
    out = []
    for view in views:
        name = names.get(view.device.uuid)
        if name is None:
            continue
        sick = view.closed is not None and view.closed not in (
            ReasonCode.DRAINING,
            ReasonCode.DEVICE_DEGRADED,
        )
        health = Health.UNHEALTHY if sick else Health.HEALTHY
        out.append(DeviceHealth(pool, name, health, view.closed_detail if sick else ""))
    return out
