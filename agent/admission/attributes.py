"""The nine attributes of an admission that the readiness predictor learns from. Pure.

Known when the request is decided: the accelerator model (of the chosen device), the
priority class, the job's type and model type, whether it serves generative requests, the
GPUs the whole job asked for (fractional; this lease's share of one device when the caller
does not say), its declared duration, how long it waited in the scheduler, and how many
leases the node held at that moment. Nothing produced after the decision is among them.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.core.lease import HISTORY_ATTRIBUTES
from agent.core.types import AdmissionRequest, Device


def admission_attributes(
    request: AdmissionRequest, device: Device, *, concurrent_requests: int
) -> dict[str, float | str]:
    job = request.job
    attributes: dict[str, float | str] = {
        "accelerator_model": device.model,
        "priority": request.priority.value,
        "job_type": job.job_type,
        "model_type": job.model_type,
        "generative": 1.0 if job.generative else 0.0,
        "requested_gpus": job.requested_gpus or round(request.thread_pct / 100.0, 4),
        "declared_duration_s": job.declared_duration_s,
        "scheduling_delay_s": job.scheduling_delay_s,
        "concurrent_requests": float(concurrent_requests),
    }
    assert tuple(attributes) == HISTORY_ATTRIBUTES
    return attributes


def readiness_order(probabilities: Sequence[float]) -> list[int]:
    """Request indices, most likely to become ready first; arrival order breaks ties."""
    return sorted(range(len(probabilities)), key=lambda i: (-probabilities[i], i))
