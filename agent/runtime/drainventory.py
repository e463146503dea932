"""What the node publishes as a DRA driver, from what its ledger sees: one device per
shared GPU or MIG instance, its consumable capacities, the attributes a CEL selector can
ask for, taints for devices closed to new shares, and the devices' health. Pure: the
same views give the same slice (so an unchanged node writes nothing).

Memory and clients agree with the ledger by construction: ``memory`` is the device's memory
less the reserve and a CUDA context overhead for each of the ``clients`` a device may take,
so any set of shares the scheduler fits on a device fits the ledger's memory and client cap.
What the slice cannot say (the guaranteed-thread budget, the trust domain, the retention
gate) the agent says at the binding answer, and again at Prepare."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agent.admission.isolation import isolation_of
from agent.admission.policy import DeviceView, Rules
from agent.config.dra import DraSettings
from agent.core.quantity import binary_quantity
from agent.core.types import Device, ReasonCode
from agent.core.units import MIB, parse_bytes
from agent.dra.claims import ADMITTED, REFUSED
from agent.dra.port import DeviceHealth, Health
from agent.dra.slices import Capacity, SliceDevice, Taint

MIN_SHARE_BYTES = 256 * MIB
QUIET_THREADS_PCT = 50.0  # at most this much compute committed: "quiet"
TAINT_OF_REASON = {
    ReasonCode.DRAINING: "gpushare.io/drained",
    ReasonCode.DEVICE_DEGRADED: "gpushare.io/degraded",
    ReasonCode.DEVICE_UNAVAILABLE: "gpushare.io/mps-down",
}
FAULT_TAINT = "gpushare.io/fault"  # any other closure: a fault, the store failing closed


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


def taints(view: DeviceView) -> tuple[Taint, ...]:
    if view.closed is None:
        return ()
    key = TAINT_OF_REASON.get(view.closed, FAULT_TAINT)
    return (Taint(key=key, effect="NoSchedule", value=view.closed.value.lower()),)


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
) -> Inventory:
    """What to publish; ``floor_of`` says which leases have a retention floor (stated, or
    their profile's): a device with one is ``protected``."""
    by_uuid = {v.device.uuid: v.device for v in views}
    devices, uuid_of = [], {}
    conditions = ((ADMITTED,), (REFUSED,)) if dra.binding_conditions else ((), ())
    for view in sorted(views, key=lambda v: v.device.index):
        capacity = capacities(view.device, rules, dra)
        if capacity is None:
            continue
        name = device_name(view.device, by_uuid)
        major, minor = view.device.compute_capability
        devices.append(
            SliceDevice(
                name=name,
                attributes=attributes(view, floor_of),
                version_attributes={"computeCapability": f"{major}.{minor}.0"},
                capacity=capacity,
                taints=taints(view),
                binding_conditions=conditions[0],
                binding_failure_conditions=conditions[1],
            )
        )
        uuid_of[name] = view.device.uuid
    return Inventory(tuple(devices), uuid_of, {u: n for n, u in uuid_of.items()})


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
