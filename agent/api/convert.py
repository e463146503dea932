"""Core types to protobuf messages (and back, where callers send them)."""

from __future__ import annotations

from agent import __version__
from agent.admission.isolation import Isolation, isolation_of
from agent.api.proto import agent_pb2 as pb
from agent.core.lease import Lease
from agent.core.mpsstate import MpsDaemonState
from agent.core.samples import Sample, WindowSample
from agent.core.snapshot import DeviceLedger, NodeSnapshot
from agent.core.types import AdmitResult, Decision, Device, Event


def device_to_pb(device: Device) -> pb.Device:
    major, minor = device.compute_capability
    return pb.Device(
        uuid=device.uuid,
        index=device.index,
        model=device.model,
        memory_bytes=device.memory_bytes,
        sharing_mode=device.sharing_mode.value,
        compute_capability=f"{major}.{minor}",
        parent_uuid=device.parent_uuid or "",
        mig_profile=device.mig_profile or "",
        isolation=isolation_to_pb(isolation_of(device)),
    )


def isolation_to_pb(isolation: Isolation) -> pb.Isolation:
    return pb.Isolation(
        memory=isolation.memory.value,
        faults=isolation.faults.value,
        compute=isolation.compute.value,
    )


def mps_to_pb(state: MpsDaemonState) -> pb.MpsDaemon:
    return pb.MpsDaemon(
        device_uuid=state.device_uuid,
        up=state.up,
        backend=state.backend,
        pid=state.pid or 0,
        restarts=state.restarts,
        default_thread_pct=state.default_thread_pct or 0.0,
        default_memory_limit_bytes=state.default_memory_limit_bytes or 0,
        detail=state.detail,
        pipe_dir=state.pipe_dir,
        servers=[pb.MpsServer(pid=s.pid, client_pids=s.client_pids) for s in state.servers],
        defaults_drift_total=state.defaults_drift_total,
    )


def sample_to_pb(sample: Sample) -> pb.Sample:
    return pb.Sample(
        device_uuid=sample.device_uuid, taken_at=sample.taken_at, counters=dict(sample.counters)
    )


def window_to_pb(window: WindowSample) -> pb.Window:
    return pb.Window(
        device_uuid=window.device_uuid,
        start_at=window.start_at,
        window_s=window.window_s,
        sample_count=window.sample_count,
        mean=dict(window.mean),
        max=dict(window.max),
    )


def snapshot_to_pb(snapshot: NodeSnapshot) -> pb.GetNodeResponse:
    return pb.GetNodeResponse(
        node_name=snapshot.node_name,
        simulated=snapshot.simulated,
        agent_version=__version__,
        taken_at=snapshot.taken_at,
        devices=[device_to_pb(d) for d in snapshot.devices],
        mps=[mps_to_pb(m) for m in snapshot.mps],
        latest_samples=[sample_to_pb(s) for s in snapshot.latest_samples],
        latest_windows=[window_to_pb(w) for w in snapshot.latest_windows],
        telemetry_source=snapshot.telemetry_source,
        stale_devices=list(snapshot.stale_devices),
        leases=[
            lease_to_pb(lease, _index(snapshot, lease.device_uuid)) for lease in snapshot.leases
        ],
        ledger=[ledger_to_pb(entry) for entry in snapshot.ledger],
        gone_devices=[
            pb.GoneDevice(
                device_uuid=g.device_uuid, since=g.since, leases_failed=g.leases_failed, when=g.when
            )
            for g in snapshot.gone_devices
        ],
        stranded_memory_bytes=snapshot.stranded_memory_bytes,
        stranded_thread_pct=snapshot.stranded_thread_pct,
        last_event_seq=snapshot.last_event_seq,
        retention_estimates=dict(snapshot.retention_estimates),
        ineffective_ratio=snapshot.ineffective_ratio,
        injector=snapshot.injector,
    )


def ledger_to_pb(entry: DeviceLedger) -> pb.DeviceLedger:
    return pb.DeviceLedger(
        device_uuid=entry.device_uuid,
        memory_committed_bytes=entry.memory_committed_bytes,
        threads_committed_pct=entry.threads_committed_pct,
        leases=entry.leases,
        closed=entry.closed,
        closed_detail=entry.closed_detail,
    )


def _index(snapshot: NodeSnapshot, device_uuid: str) -> int:
    return next((d.index for d in snapshot.devices if d.uuid == device_uuid), 0)


def lease_to_pb(lease: Lease, device_index: int = 0) -> pb.Lease:
    """``lease`` as the API shows it; ``run_as_uid`` is left unset when unknown."""
    return pb.Lease(
        lease_id=lease.lease_id,
        request_id=lease.request_id,
        gang_id=lease.gang_id or "",
        tenant=lease.tenant,
        trust_domain=lease.trust_domain,
        device_uuid=lease.device_uuid,
        device_index=device_index,
        priority=lease.priority.value,
        memory_bytes=lease.memory_bytes,
        thread_pct=lease.thread_pct,
        state=lease.state.value,
        created_at=lease.created_at,
        updated_at=lease.updated_at,
        expires_at=lease.expires_at or 0.0,
        reason=lease.reason,
        profile=lease.profile or "",
        retention_floor=lease.retention_floor or 0.0,
        owner=lease.owner,
        workload=lease.workload,
        pod=lease.pod,
        run_as_uid=lease.run_as_uid,
    )


def decision_to_pb(decision: Decision) -> pb.Decision:
    return pb.Decision(
        admitted=decision.admitted,
        device_uuid=decision.device_uuid or "",
        reason=decision.reason.value if decision.reason else "",
        message=decision.message,
        attempts=[
            pb.DeviceAttempt(
                device_uuid=a.device_uuid,
                fits=a.fits,
                reason=a.reason.value if a.reason else "",
                detail=a.detail,
                predictions=dict(a.predictions),
            )
            for a in decision.attempts
        ],
        preempted_lease_ids=list(decision.preempted_lease_ids),
        preempted_lease_s=decision.preempted_lease_s,
        predictions=dict(decision.predictions),
        estimator=decision.estimator,
    )


def result_to_pb(result: AdmitResult, device: Device | None = None) -> pb.AdmitResponse:
    """``device``: the lease's device, for its index and, on an admitted answer, what its
    sharing mode isolates (left unset without it)."""
    response = pb.AdmitResponse(
        decision=decision_to_pb(result.decision),
        env=dict(result.env),
        mounts=[pb.Mount(host_path=h, container_path=c) for h, c in result.mounts],
    )
    if result.lease is not None:
        response.lease.CopyFrom(lease_to_pb(result.lease, device.index if device else 0))
        if device is not None:
            response.isolation.CopyFrom(isolation_to_pb(isolation_of(device)))
    return response


def event_to_pb(event: Event) -> pb.Event:
    return pb.Event(
        seq=event.seq,
        at=event.at,
        kind=event.kind,
        message=event.message,
        device_uuid=event.device_uuid or "",
        lease_id=event.lease_id or "",
        attrs=dict(event.attrs),
        epoch=event.epoch,
    )
