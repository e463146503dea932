"""The agent's answers to the kubelet for ``gpushare.io/share``.

``Allocate`` does not say which pod it is for. The scheduler extender binds the pods of a
node one at a time, each after the previous was allocated (or its hold expired), so the
lease to hand out is the oldest lease of a pod that is admitted, not yet allocated and
whose hold has not expired. ``PreStartContainer`` then checks with the kubelet's
PodResources which pod those share units went to: a container of another pod than the
lease's is refused (and an event says so), never run with another pod's limits.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from agent.config.kubelet import KubeletSettings
from agent.core.lease import Lease, LeaseState, pod_uid_of
from agent.core.types import Decision
from agent.kubelet.port import LEASE_ANNOTATION, AllocationRefused, ContainerAllocation, Mount
from agent.nri.port import BindMount, Injection, InjectionRefused, PodRef
from agent.runtime.events import EventLog
from agent.runtime.node import NodeService

log = logging.getLogger(__name__)

SHM_PATH = "/dev/shm"
KEPT = 10_000  # allocations remembered (a node runs far fewer pods)
# With the NRI plugin registered, Allocate hands out this marker and no device; the
# plugin gives each container that carries it its pod's lease at CreateContainer. If
# the plugin is gone by then, the container starts with no GPU ("void"), never another
# pod's share.
NRI_MARKER = "GPUSHARE_NRI"
DEFERRED_ENV = {NRI_MARKER: "1", "NVIDIA_VISIBLE_DEVICES": "void"}

# the pod ("<namespace>/<name>") whose containers hold these share units, per the kubelet
PodOfUnits = Callable[[Sequence[str]], Awaitable[str | None]]


def next_hold(
    leases: Iterable[Lease], allocated: Iterable[str], *, now: float, hold_s: float
) -> Lease | None:
    """The oldest admitted pod lease not allocated yet whose hold (from its admission) has
    not expired."""
    done = set(allocated)
    waiting = [
        x
        for x in leases
        if x.pod
        and x.state is LeaseState.ADMITTED
        and x.lease_id not in done
        and now - x.updated_at <= hold_s
    ]
    return min(waiting, key=lambda x: (x.created_at, x.lease_id), default=None)


class PodAllocator:
    def __init__(
        self,
        node: NodeService,
        events: EventLog,
        settings: KubeletSettings,
        *,
        pod_of_units: PodOfUnits,
        clock: Callable[[], float],
    ) -> None:
        self._node = node
        self._events = events
        self._settings = settings
        self._pod_of_units = pod_of_units
        self._clock = clock
        self._by_units: dict[frozenset[str], str] = {}  # share units -> lease id
        # every lease handed out, newest last: share units are given to the next pod when a
        # pod ends, so the units' entry alone would make a live lease look unallocated
        self._allocated: dict[str, None] = {}
        self._deferred: dict[frozenset[str], None] = {}  # units handed out for NRI to fill
        self.nri_registered = False  # set by the NRI plugin as it (un)registers

    def device_ids(self) -> Sequence[str]:
        return [f"share-{i}" for i in range(self._settings.slots)]

    async def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        units = frozenset(device_ids)
        if self.nri_registered:
            self._by_units.pop(units, None)  # reused units: what they carry now is this
            self._deferred[units] = None
            while len(self._deferred) > KEPT:
                del self._deferred[next(iter(self._deferred))]
            return ContainerAllocation(envs=dict(DEFERRED_ENV))
        lease = next_hold(
            self._node.leases.values(),
            self._allocated,
            now=self._clock(),
            hold_s=self._settings.hold_s,
        )
        if lease is None:
            raise AllocationRefused(
                "no pod lease waits for its allocation on this node: a pod asking for "
                "gpushare.io/share must be bound by the gpushare scheduler (and within "
                f"{self._settings.hold_s:.0f} s)"
            )
        self._deferred.pop(units, None)  # reused units: checked with PodResources again
        self._remember(units, lease.lease_id)
        self._events(
            "lease.allocated",
            f"lease {lease.lease_id} of pod {lease.pod} allocated by the kubelet",
            device_uuid=lease.device_uuid,
            lease_id=lease.lease_id,
        )
        return self._allocation(lease)

    def _allocation(self, lease: Lease) -> ContainerAllocation:
        result = self._node.admissions.result(Decision(True, lease.device_uuid), lease)
        envs = {**result.env, "NVIDIA_VISIBLE_DEVICES": lease.device_uuid}
        mounts = [Mount(container_path=c, host_path=h) for h, c in result.mounts]
        if self._settings.shm_dir:
            mounts.append(Mount(container_path=SHM_PATH, host_path=self._settings.shm_dir))
        cdi = [f"nvidia.com/gpu={lease.device_uuid}"] if self._settings.cdi else []
        return ContainerAllocation(
            envs=envs,
            mounts=mounts,
            cdi_devices=cdi,
            annotations={LEASE_ANNOTATION: lease.lease_id},
        )

    def _remember(self, units: frozenset[str], lease_id: str) -> None:
        self._by_units[units] = lease_id
        while len(self._by_units) > KEPT:
            del self._by_units[next(iter(self._by_units))]
        self._mark_allocated(lease_id)

    def _mark_allocated(self, lease_id: str) -> None:
        self._allocated[lease_id] = None
        while len(self._allocated) > KEPT:
            del self._allocated[next(iter(self._allocated))]

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """Refuse a container whose share units went to another pod than their lease's."""
        units = frozenset(device_ids)
        if units in self._deferred:
            return  # the NRI plugin checks the pod at CreateContainer
        holder = await self._pod_of_units(device_ids)
        lease_id = self._by_units.get(units) or self._lease_of_pod(holder)
        lease = self._node.leases.get(lease_id) if lease_id else None
        if lease is None:
            raise AllocationRefused(
                f"no live lease for the share units {sorted(units)} (pod {holder or 'unknown'})"
            )
        if holder != lease.pod:
            self._events(
                "lease.allocation_mismatch",
                f"the kubelet gave lease {lease.lease_id} of pod {lease.pod} to pod "
                f"{holder or 'unknown'}: its container is refused",
                device_uuid=lease.device_uuid,
                lease_id=lease.lease_id,
            )
            raise AllocationRefused(
                f"share units allocated with lease {lease.lease_id} of pod {lease.pod}, but "
                f"the kubelet gave them to pod {holder or 'unknown'}: refused"
            )

    def _lease_of_pod(self, pod: str | None) -> str | None:
        """After an agent restart: the live lease made for this pod."""
        found = [x.lease_id for x in self._node.leases.values() if pod and x.pod == pod]
        return found[0] if found else None

    async def inject(self, pod: PodRef, container: str, env: Sequence[str]) -> Injection | None:
        """At CreateContainer (NRI): the lease of the container's pod, for a container
        whose Allocate was deferred to this point; None for any other container."""
        if f"{NRI_MARKER}=1" not in env:
            return None
        lease_id = pod.annotations.get(LEASE_ANNOTATION, "")
        lease = self._node.leases.get(lease_id) if lease_id else None
        if lease is None or lease.state not in (LeaseState.ADMITTED, LeaseState.READY):
            raise InjectionRefused(
                f"container {container} of pod {pod.key} asks for gpushare.io/share, but "
                f"the pod has no live lease here ({LEASE_ANNOTATION}={lease_id or 'unset'}): "
                "it must be bound by the gpushare scheduler"
            )
        if lease.pod != pod.key or pod_uid_of(lease.request_id) != pod.uid:
            self._events(
                "lease.allocation_mismatch",
                f"pod {pod.key} names lease {lease.lease_id} of pod {lease.pod}: its "
                f"container {container} is refused",
                device_uuid=lease.device_uuid,
                lease_id=lease.lease_id,
            )
            raise InjectionRefused(
                f"lease {lease.lease_id} belongs to pod {lease.pod}, not to {pod.key}: refused"
            )
        if lease.lease_id not in self._allocated:
            self._mark_allocated(lease.lease_id)
            self._events(
                "lease.allocated",
                f"lease {lease.lease_id} of pod {lease.pod} given to its container "
                f"{container} by the runtime (NRI)",
                device_uuid=lease.device_uuid,
                lease_id=lease.lease_id,
            )
        allocation = self._allocation(lease)
        mounts = [BindMount(m.host_path, m.container_path, m.read_only) for m in allocation.mounts]
        return Injection(env=allocation.envs, mounts=mounts, annotations=allocation.annotations)
