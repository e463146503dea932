"""The agent's answers to the kubelet for ``gpushare.io/share``.

``Allocate`` does not say which pod it is for. The scheduler extender binds the pods of a
node one at a time, each after the previous was allocated (or its hold expired), so the
lease to hand out is the oldest lease of a pod that is admitted, not yet allocated and
whose hold has not expired. A hold runs from the lease's latest grant: its admission (or
its gang's commit), or an ``Admit`` with the same request id answered again to its binder,
so a bind retried after the hold still gets an allocatable lease. ``PreStartContainer``
then checks with the kubelet's PodResources which pod those share units went to: a
container of another pod than the lease's is refused (and an event says so), never run
with another pod's limits. ``Allocate`` for ids this plugin does not advertise is refused
before any lease is looked at.

Every pairing is a durable fact (:mod:`agent.legacy.deviceplugin.allocations`): the lease handed to
some share units, units answered with the NRI marker, a grant repeated, the pod found at
PreStartContainer. Each is on disk before the kubelet, the runtime or the binder hears
back, and the book is read back at start. An Allocate or an NRI injection whose record
cannot be written is refused; a repeated grant or a PreStartContainer check whose record
cannot be written is logged and answered (the hold then runs from the last recorded
grant; the pairing itself was recorded at Allocate). So an agent restarted between Allocate and
PreStartContainer, or between a grant and its Binding, resumes where it was, and never
hands a running pod's lease to the next pod.

What a container gets besides its lease's environment: the device's MPS pipe directory,
read-only (it can reach the daemon, never remove, replace or add an entry that the next
tenant's clients rely on), and at ``/dev/shm`` the shared memory of the device's MPS
servers: their own directory (``mps.shm_root``), made ready for the lease's trust domain
before the answer (:meth:`SharedMemory.claim_shm`: when it served another domain, the
servers are shut down, it is emptied and the defaults set again), else
``kubelet.shm_dir``. A device whose shared memory cannot be made ready is refused.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Protocol

from agent.config.kubelet import KubeletSettings
from agent.core.errors import MpsError, StateError
from agent.core.lease import Lease, LeaseState
from agent.core.types import Event
from agent.legacy.deviceplugin.allocations import KEPT, AllocationBook
from agent.legacy.deviceplugin.kubelet.port import AllocationRefused, ContainerAllocation, Mount
from agent.legacy.deviceplugin.nri.port import BindMount, Injection, InjectionRefused, PodRef
from agent.legacy.deviceplugin.records import AllocationKind, AllocationRecord, AllocationStore
from agent.legacy.podleases import LEASE_ANNOTATION, pod_uid_of
from agent.mps.shmstate import sole_on_device
from agent.node.events import EventLog
from agent.node.service import NodeService
from agent.state.port import WriteBatch

log = logging.getLogger(__name__)

SHM_PATH = "/dev/shm"
# With the NRI plugin registered, Allocate hands out this marker and no device; the
# plugin gives each container that carries it its pod's lease at CreateContainer. If
# the plugin is gone by then, the container starts with no GPU ("void"), never another
# pod's share.
NRI_MARKER = "GPUSHARE_NRI"
DEFERRED_ENV = {NRI_MARKER: "1", "NVIDIA_VISIBLE_DEVICES": "void"}

# the pod ("<namespace>/<name>") whose containers hold these share units, per the kubelet
PodOfUnits = Callable[[Sequence[str]], Awaitable[str | None]]


class SharedMemory(Protocol):
    """The node's MPS daemons, as far as containers' /dev/shm goes (the MPS manager)."""

    async def claim_shm(self, device_uuid: str, trust_domain: str, *, sole: bool = False) -> str:
        """The device's shared memory made ready for ``trust_domain``; "" none of its own."""
        ...


def next_hold(
    leases: Iterable[Lease],
    allocated: Collection[str],
    *,
    now: float,
    hold_s: float,
    granted_at: Mapping[str, float] | None = None,
) -> Lease | None:
    """The oldest admitted pod lease not allocated yet whose hold has not expired. A hold
    runs from the lease's latest grant: its own time (admission, or its gang's commit), or
    a later grant of the same lease in ``granted_at``."""
    again = granted_at or {}
    waiting = [
        x
        for x in leases
        if x.pod
        and x.state is LeaseState.ADMITTED
        and x.lease_id not in allocated
        and now - max(x.updated_at, again.get(x.lease_id, x.updated_at)) <= hold_s
    ]
    return min(waiting, key=lambda x: (x.created_at, x.lease_id), default=None)


def holds_again(
    lease: Lease, asked_at: float, *, taken: Collection[str], granted_at: Mapping[str, float]
) -> bool:
    """Whether an Admit that began at ``asked_at`` and answered with ``lease`` starts the
    lease's hold again: a pod lease waiting for its Allocate, granted before that Admit
    began (the same request id asked again: a retried bind), not since then."""
    return (
        bool(lease.pod)
        and lease.state is LeaseState.ADMITTED
        and lease.lease_id not in taken
        and lease.updated_at < asked_at
        and granted_at.get(lease.lease_id, lease.updated_at) < asked_at
    )


def unadvertised(device_ids: Sequence[str], advertised: Collection[str]) -> list[str]:
    """The ids of an Allocate that the plugin never advertised."""
    return [d for d in dict.fromkeys(device_ids) if d not in advertised]


class PodAllocator:
    def __init__(
        self,
        node: NodeService,
        events: EventLog,
        settings: KubeletSettings,
        *,
        store: AllocationStore,
        pod_of_units: PodOfUnits,
        clock: Callable[[], float],
        shm: SharedMemory | None = None,
    ) -> None:
        self._node = node
        self._shm = shm
        self._events = events
        self._settings = settings
        self._store = store
        self._pod_of_units = pod_of_units
        self._clock = clock
        self._book = AllocationBook()
        self._advertised = frozenset(self.device_ids())
        self.nri_registered = False  # set by the NRI plugin as it (un)registers

    async def load(self) -> None:
        """Read the book back from the store: at start, before the kubelet can call."""
        records = [AllocationRecord.from_row(r) for r in await self._store.allocation_records()]
        self._book = AllocationBook.replay(records)
        self._book.forget_all_but(self._node.leases.keys())
        log.info("kubelet allocations: %d record(s) read back", len(records))

    def device_ids(self) -> Sequence[str]:
        return [f"share-{i}" for i in range(self._settings.slots)]

    # -- Allocate --------------------------------------------------------------------------

    async def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        units = self._advertised_units(device_ids)
        now = self._clock()
        if self.nri_registered:
            deferred = AllocationRecord(AllocationKind.DEFERRED, now, units=tuple(sorted(units)))
            await self._recorded([deferred], what="the units deferred to the NRI plugin")
            return ContainerAllocation(envs=dict(DEFERRED_ENV))
        lease = next_hold(
            self._node.leases.values(),
            self._book.taken,
            now=now,
            hold_s=self._settings.hold_s,
            granted_at=self._book.granted_at,
        )
        if lease is None:
            raise AllocationRefused(
                "no pod lease waits for its allocation on this node: a pod asking for "
                "gpushare.io/share must be bound by the gpushare scheduler (and within "
                f"{self._settings.hold_s:.0f} s)"
            )
        try:
            shm_dir = await self._claim_shm(lease)
        except MpsError as exc:
            raise AllocationRefused(f"lease {lease.lease_id}: {exc}") from exc
        record = AllocationRecord(
            AllocationKind.ALLOCATED, now, lease.lease_id, units=tuple(sorted(units))
        )
        told = self._allocated_event(lease, "allocated by the kubelet")
        await self._recorded([record], [told], holding=lease.lease_id, what="the allocation")
        return self._allocation(lease, shm_dir)

    async def _claim_shm(self, lease: Lease) -> str:
        """The host directory the lease's container gets at /dev/shm: its MPS servers' own,
        ready for the lease's trust domain, else kubelet.shm_dir ("" none)."""
        own = ""
        if self._shm is not None:
            sole = sole_on_device(lease, self._node.leases.values())
            own = await self._shm.claim_shm(lease.device_uuid, lease.trust_domain, sole=sole)
        return own or self._settings.shm_dir

    def _advertised_units(self, device_ids: Sequence[str]) -> frozenset[str]:
        if not device_ids:
            raise AllocationRefused("Allocate names no share unit: no lease is handed out")
        unknown = unadvertised(device_ids, self._advertised)
        if unknown:
            raise AllocationRefused(
                f"share units {unknown} are not among the {len(self._advertised)} this "
                f"node's gpushare agent advertises (share-0 to "
                f"share-{len(self._advertised) - 1}): no lease is handed out"
            )
        return frozenset(device_ids)

    async def _recorded(
        self,
        records: Sequence[AllocationRecord],
        events: Sequence[Event] = (),
        *,
        holding: str | None = None,
        what: str,
    ) -> None:
        """Make the records (with their events) durable before the kubelet hears back;
        refuse when they cannot be written."""
        try:
            await self._write(records, events, holding=holding)
        except StateError as exc:
            raise AllocationRefused(f"cannot record {what} on this node: {exc}") from exc

    async def _write(
        self,
        records: Sequence[AllocationRecord],
        events: Sequence[Event] = (),
        *,
        holding: str | None = None,
    ) -> None:
        """Write ``records`` and ``events`` in one commit; the book takes the records once
        they are durable. ``holding``: a lease nobody else gets while this write runs. The
        write goes on if the caller goes away; raises StateError if it fails."""

        def durable(_numbered: Sequence[Event]) -> None:
            for record in records:
                self._book.apply(record)
            if self._book.size() > KEPT:
                self._book.forget_all_but(self._node.leases.keys())

        if holding is not None:
            self._book.hold(holding)
        rows = [r.as_row() for r in records]
        batch = WriteBatch(events=events, on_durable=durable, allocations=rows)
        write = asyncio.ensure_future(self._store.commit(batch))
        write.add_done_callback(functools.partial(self._settled, holding))
        await asyncio.shield(write)

    def _settled(self, holding: str | None, write: asyncio.Future[list[Event]]) -> None:
        if holding is not None:
            self._book.unhold(holding)
        if not write.cancelled():
            write.exception()  # heard by the caller, if it is still there

    def _allocated_event(self, lease: Lease, how: str) -> Event:
        return self._events.draft(
            "lease.allocated",
            f"lease {lease.lease_id} of pod {lease.pod} {how}",
            device_uuid=lease.device_uuid,
            lease_id=lease.lease_id,
        )

    def _allocation(self, lease: Lease, shm_dir: str) -> ContainerAllocation:
        envs, edits = self._node.container_edits(lease)
        # the pipe directory, read-only: connect(2) to its sockets works, no entry changes
        mounts = [Mount(container_path=c, host_path=h, read_only=True) for h, c in edits]
        if shm_dir:
            mounts.append(Mount(container_path=SHM_PATH, host_path=shm_dir))
        cdi = [f"nvidia.com/gpu={lease.device_uuid}"] if self._settings.cdi else []
        return ContainerAllocation(
            envs=envs,
            mounts=mounts,
            cdi_devices=cdi,
            annotations={LEASE_ANNOTATION: lease.lease_id},
        )

    # -- a grant repeated to its binder ----------------------------------------------------

    async def granted(self, lease: Lease, asked_at: float) -> None:
        """The node's hook for each Admit answered: a pod lease granted again to its binder
        (same request id: a retried bind) starts its hold again, recorded before the binder
        hears back. If that cannot be written, the hold runs from the last recorded grant:
        the pod may fail its Allocate, never get another pod's lease."""
        if lease.updated_at >= asked_at:  # granted by this very Admit: most answers
            return
        if not holds_again(
            lease, asked_at, taken=self._book.taken, granted_at=self._book.granted_at
        ):
            return
        record = AllocationRecord(AllocationKind.GRANTED, asked_at, lease.lease_id, pod=lease.pod)
        try:
            await self._write([record])
        except StateError as exc:
            log.warning(
                "lease %s of pod %s granted again, but its hold cannot start again: %s",
                lease.lease_id,
                lease.pod,
                exc,
            )

    # -- PreStartContainer -----------------------------------------------------------------

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """Refuse a container whose share units went to another pod than their lease's."""
        units = frozenset(device_ids)
        if self._book.deferred(units):
            return  # the NRI plugin checks the pod at CreateContainer
        holder = await self._pod_of_units(device_ids)
        lease_id = self._book.lease_of(units) or self._lease_of_pod(holder)
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
        if self._book.pod_of(lease.lease_id) != holder:
            await self._note_checked(lease, units)

    async def _note_checked(self, lease: Lease, units: frozenset[str]) -> None:
        """Record the pod found with the lease's units (its first PreStartContainer)."""
        record = AllocationRecord(
            AllocationKind.CHECKED, self._clock(), lease.lease_id, tuple(sorted(units)), lease.pod
        )
        try:
            await self._write([record])
        except StateError as exc:  # the pairing itself is on disk since its Allocate
            log.warning("pod %s of lease %s not recorded: %s", lease.pod, lease.lease_id, exc)

    def _lease_of_pod(self, pod: str | None) -> str | None:
        """Units with no record (allocated before records were kept): the live lease made
        for this pod."""
        found = [x.lease_id for x in self._node.leases.values() if pod and x.pod == pod]
        return found[0] if found else None

    # -- CreateContainer (NRI) -------------------------------------------------------------

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
        try:
            shm_dir = await self._claim_shm(lease)
        except MpsError as exc:
            raise InjectionRefused(f"lease {lease.lease_id}: {exc}") from exc
        if not self._book.handed_out(lease.lease_id):
            await self._record_injected(lease, pod, container)
        allocation = self._allocation(lease, shm_dir)
        mounts = [BindMount(m.host_path, m.container_path, m.read_only) for m in allocation.mounts]
        return Injection(env=allocation.envs, mounts=mounts, annotations=allocation.annotations)

    async def _record_injected(self, lease: Lease, pod: PodRef, container: str) -> None:
        record = AllocationRecord(
            AllocationKind.ALLOCATED, self._clock(), lease.lease_id, pod=pod.key
        )
        told = self._allocated_event(
            lease, f"given to its container {container} by the runtime (NRI)"
        )
        try:
            await self._write([record], [told], holding=lease.lease_id)
        except StateError as exc:
            raise InjectionRefused(
                f"cannot record the allocation of lease {lease.lease_id} on this node: {exc}"
            ) from exc
