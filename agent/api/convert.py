"""Core types to protobuf messages (and back, where callers send them)."""

from __future__ import annotations

from agent import __version__
from agent.api.proto import agent_pb2 as pb
from agent.core.types import Device, MpsDaemonState, NodeSnapshot, Sample, WindowSample


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
    )
