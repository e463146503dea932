"""Request ids: the fingerprint of a request, and the answer to a request id seen before.

A request id is scoped by tenant and stored with the canonical request it came with; the
same id with a different request is refused with ALREADY_EXISTS, naming what differs, and
the same id from another caller with PERMISSION_DENIED, naming nothing of that caller's.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agent.core.errors import AlreadyExistsError, PermissionDeniedError
from agent.core.types import AdmissionRequest
from agent.state.port import RequestRecord

ECHO_CHARS = 64


def canonical(request: AdmissionRequest, gang_id: str | None) -> dict[str, Any]:
    """Everything that makes the request what it is, but its id (by hand: ``asdict`` is
    a fifth of an admission's CPU)."""
    job = request.job
    return {
        "tenant": request.tenant,
        "trust_domain": request.trust_domain,
        "priority": request.priority.value,
        "memory_bytes": request.memory_bytes,
        "thread_pct": request.thread_pct,
        "profile": request.profile,
        "retention_floor": request.retention_floor,
        "gpu_model": request.gpu_model,
        "counters": dict(sorted(request.counters.items())),
        "job": [
            job.job_type,
            job.model_type,
            job.generative,
            job.requested_gpus,
            job.declared_duration_s,
            job.scheduling_delay_s,
        ],
        "gang_id": gang_id,
        "workload": request.workload,
        "owner": request.owner,
        # only when set: requests recorded before pods existed keep their fingerprints
        **({"pod": request.pod} if request.pod else {}),
        **({"device_uuid": request.device_uuid} if request.device_uuid else {}),
        **({"run_as_uid": request.run_as_uid} if request.run_as_uid is not None else {}),
    }


def record_for(
    request: AdmissionRequest, gang_id: str | None, lease_id: str, at: float
) -> RequestRecord:
    text = json.dumps(canonical(request, gang_id), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    return RequestRecord(request.tenant, request.request_id, digest, text, lease_id, at)


def check_same(record: RequestRecord, request: AdmissionRequest, gang_id: str | None) -> None:
    """Raise unless ``request`` is the one ``record`` was made for (legacy rows, made
    before fingerprints, match anything)."""
    if not record.fingerprint:
        return
    mine = record_for(request, gang_id, record.lease_id, record.at)
    if mine.fingerprint == record.fingerprint:
        return
    before = json.loads(record.canonical)
    now = json.loads(mine.canonical)
    if before.get("owner", now["owner"]) != now["owner"]:
        raise PermissionDeniedError(
            f"request id {_echo(request.request_id)} was used by another caller; "
            "use a new request id"
        )
    differs = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    detail = ", ".join(f"{k}: {_echo(before.get(k))} then {_echo(now.get(k))}" for k in differs)
    raise AlreadyExistsError(
        f"request id {_echo(request.request_id)} was used for another request "
        f"(lease {record.lease_id}; {detail}); use a new request id"
    )


def _echo(value: object) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "…"
