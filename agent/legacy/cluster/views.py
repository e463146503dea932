"""An agent's ``GetNode`` answer as the admission rules see a node: one
:class:`DeviceView` per device, so the extender filters with the agent's own rules and
words (``agent.admission.policy``), from a cache instead of a call per pod."""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any

from agent.admission.policy import DeviceView, Tally
from agent.api.proto import agent_pb2 as pb
from agent.core.lease import Lease, LeaseState
from agent.core.types import Device, PriorityClass, ReasonCode, SharingMode
from agent.kubeapi.port import Obj
from agent.legacy.cluster.annotations import PodAsk
from agent.legacy.podleases import pod_request_id, pod_uid_of

__all__ = ["pod_request_id", "pod_uid_of"]  # the request-id convention, from agent.core


def device_of(message: pb.Device) -> Device:
    major, _, minor = message.compute_capability.partition(".")
    capability = (int(major), int(minor)) if major.isdigit() and minor.isdigit() else (0, 0)
    return Device(
        uuid=message.uuid,
        index=message.index,
        model=message.model,
        memory_bytes=message.memory_bytes,
        sharing_mode=SharingMode(message.sharing_mode or "mps"),
        compute_capability=capability,
        parent_uuid=message.parent_uuid or None,
        mig_profile=message.mig_profile or None,
    )


def lease_of(message: pb.Lease) -> Lease:
    return Lease(
        lease_id=message.lease_id,
        request_id=message.request_id,
        tenant=message.tenant,
        trust_domain=message.trust_domain,
        device_uuid=message.device_uuid,
        priority=PriorityClass(message.priority),
        memory_bytes=message.memory_bytes,
        thread_pct=message.thread_pct,
        state=LeaseState(message.state),
        created_at=message.created_at,
        updated_at=message.updated_at,
        gang_id=message.gang_id or None,
        pod=message.pod,
        run_as_uid=message.run_as_uid if message.HasField("run_as_uid") else None,
    )


def device_views(
    node: pb.GetNodeResponse,
    extra: Iterable[Lease] = (),
    *,
    without_request: str = "",
    ended: Container[str] = (),
    shown: Sequence[Lease] | None = None,
) -> list[DeviceView]:
    """The node's devices with their live leases, plus ``extra`` (binds in flight that the
    answer does not show yet), less those ``ended`` since the answer and the leases of the
    pod whose UID is ``without_request``: a pod whose bind died after its lease was granted
    gets that same lease back on a retry (same request id), so it must not count against
    itself. ``shown``: the answer's leases already converted (the cache keeps them)."""
    by_device: dict[str, list[Lease]] = {d.uuid: [] for d in node.devices}
    seen = {x.lease_id for x in node.leases}
    answered = map(lease_of, node.leases) if shown is None else shown
    for lease in [
        *(x for x in answered if x.lease_id not in ended),
        *(x for x in extra if x.lease_id not in seen),
    ]:
        if without_request and pod_uid_of(lease.request_id) == without_request:
            continue
        by_device.setdefault(lease.device_uuid, []).append(lease)
    closed = {x.device_uuid: x for x in node.ledger if x.closed}
    views = []
    for message in node.devices:
        entry = closed.get(message.uuid)
        leases = tuple(by_device[message.uuid])
        views.append(
            DeviceView(
                device_of(message),
                leases,
                closed=ReasonCode(entry.closed) if entry is not None else None,
                closed_detail=entry.closed_detail if entry is not None else "",
                tally=Tally.of(leases),  # summed once: the view is read for many pods
                domains=frozenset(x.trust_domain for x in leases),
                users=frozenset(x.run_as_uid for x in leases if x.run_as_uid is not None),
            )
        )
    return views


PRIORITY = {"guaranteed": pb.GUARANTEED, "burstable": pb.BURSTABLE, "best-effort": pb.BEST_EFFORT}


def request_fields(pod: Obj, ask: PodAsk) -> dict[str, Any]:
    """The agent request for this pod: its UID is the request id (a retry is the same
    request; :func:`pod_request_id` once a lease of it has ended), its namespace the
    tenant and the trust domain."""
    meta = pod["metadata"]
    return {
        "request_id": meta["uid"],
        "tenant": ask.tenant,
        "trust_domain": ask.trust_domain,
        "priority": PRIORITY[ask.priority.value],
        "memory_bytes": ask.memory_bytes,
        "thread_pct": ask.thread_pct,
        "workload": f"pod:{meta['uid']}",
        "pod": f"{meta['namespace']}/{meta['name']}",
    }
