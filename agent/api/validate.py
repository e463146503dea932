"""Requests from the wire to core types, refusing what is malformed with the field's name.

Strings are bounded, numbers range-checked, enums must be known. No string may hold
control characters (Unicode Cc, C1 included), line or paragraph separators, or
bidirectional formatting characters: they forge log lines and reorder what people read.
A value echoed in a message is cut to :data:`MAX_SHOWN` characters. Everything here
raises :class:`ValidationError` (INVALID_ARGUMENT), never anything else.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from agent.admission.sizing import Mode, SizingSpec, size
from agent.api.proto import agent_pb2 as pb
from agent.core import k8snames
from agent.core.errors import ValidationError
from agent.core.lease import CLAIM_REQUEST_PREFIX
from agent.core.logsafe import quoted
from agent.core.types import AdmissionRequest, JobAttributes, PriorityClass

MAX_TEXT = 128
MAX_SHOWN = 64  # characters of a caller's value repeated in a message
MAX_DEVICE_ID = 128
# U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069: bidirectional marks, embeddings,
# overrides and isolates; U+2028/U+2029: line and paragraph separators.
FORBIDDEN = frozenset(
    "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
MAX_MEMORY_BYTES = 2**50  # 1 PiB: nothing real asks for more
MIN_MEMORY_BYTES = 2**20  # MPS limits are whole MiB
_ID_RE = re.compile(r"^[A-Za-z0-9._:/@+=-]+$")
# the forbidden characters and Unicode's Cc (C0, DEL, C1): one search in C for a clean value
_FORBIDDEN_RE = re.compile("[\x00-\x1f\x7f-\x9f" + "".join(sorted(FORBIDDEN)) + "]")
PRIORITIES = {
    pb.GUARANTEED: PriorityClass.GUARANTEED,
    pb.BURSTABLE: PriorityClass.BURSTABLE,
    pb.BEST_EFFORT: PriorityClass.BEST_EFFORT,
}


def shown(value: str, limit: int = MAX_SHOWN) -> str:
    """``value`` for a message: at most ``limit`` characters, then an ellipsis, repr-quoted
    so that nothing in it is printed raw (:func:`agent.core.logsafe.quoted`)."""
    return quoted(value, limit)


def forbidden_character(value: str) -> str | None:
    """A description of the first control, separator or bidi character, else None."""
    if _FORBIDDEN_RE.search(value) is None:
        return None
    for position, ch in enumerate(value):
        if ch in FORBIDDEN or unicodedata.category(ch) == "Cc":
            return f"{k8snames.code_point(ch)} at position {position}"
    return None


def clean(value: str, field: str) -> str:
    """Refuse control, line-separator and bidirectional-format characters."""
    found = forbidden_character(value)
    if found is not None:
        raise ValidationError(
            field, f"holds a control, separator or bidirectional character: {found}"
        )
    return value


def identifier(value: str, field: str, *, required: bool = True) -> str:
    clean(value, field)
    if not value:
        if required:
            raise ValidationError(field, "is required")
        return ""
    if len(value) > MAX_TEXT:
        raise ValidationError(field, f"is longer than {MAX_TEXT} characters")
    if not _ID_RE.fullmatch(value):
        raise ValidationError(field, "may hold only letters, digits and ._:/@+=-")
    return value


def text(value: str, field: str) -> str:
    if len(value) > MAX_TEXT:
        raise ValidationError(field, f"is longer than {MAX_TEXT} characters")
    return clean(value, field)


def device_id(value: str, field: str = "device_uuid") -> str:
    """A device UUID as an admin names it (empty: every device): bounded, clean, and of
    the characters device ids are made of."""
    if len(value) > MAX_DEVICE_ID:
        raise ValidationError(
            field, f"is longer than {MAX_DEVICE_ID} characters (starts {shown(value)})"
        )
    return identifier(value, field, required=False)


def fraction(value: float, field: str, low: float, high: float, *, low_open: bool) -> float:
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ValidationError(field, f"must be in {bracket}{low:g}, {high:g}] (got {value!r})")
    return value


def units_done(value: float, field: str = "units_done") -> float:
    """A cumulative count of work units: finite and >= 0."""
    if not math.isfinite(value) or value < 0:
        raise ValidationError(field, f"must be a finite number >= 0 (got {value!r})")
    return value


def caller_request_id(value: str, field: str) -> str:
    """A caller's request id: an identifier outside the prefix the DRA driver keeps."""
    found = identifier(value, field)
    if found.startswith(CLAIM_REQUEST_PREFIX):
        raise ValidationError(
            field, f"may not start with {CLAIM_REQUEST_PREFIX!r} (the DRA driver's)"
        )
    return found


def request(message: pb.Request, *, field: str = "request") -> AdmissionRequest:
    if message.priority not in PRIORITIES:
        raise ValidationError(f"{field}.priority", "must be GUARANTEED, BURSTABLE or BEST_EFFORT")
    floor = message.retention_floor
    if floor:
        fraction(floor, f"{field}.retention_floor", 0.0, 1.0, low_open=False)
    return AdmissionRequest(
        request_id=caller_request_id(message.request_id, f"{field}.request_id"),
        tenant=identifier(message.tenant, f"{field}.tenant"),
        trust_domain=identifier(message.trust_domain, f"{field}.trust_domain"),
        priority=PRIORITIES[message.priority],
        memory_bytes=memory(message, field),
        thread_pct=fraction(message.thread_pct, f"{field}.thread_pct", 0.0, 100.0, low_open=True),
        profile=identifier(message.profile, f"{field}.profile", required=False) or None,
        retention_floor=floor or None,
        gpu_model=text(message.gpu_model, f"{field}.gpu_model") or None,
        counters=counters(message.counters, f"{field}.counters"),
        job=job(message.job, f"{field}.job"),
        workload=workload(message.workload, f"{field}.workload"),
        pod=pod(message.pod, f"{field}.pod"),
        run_as_uid=run_as_uid(message, f"{field}.run_as_uid"),
    )


MAX_UID = 0xFFFFFFFE  # (uid_t)-1, 4294967295, means "no change" to setuid: never a user


def run_as_uid(message: pb.Request, field: str) -> int | None:
    """The UID the share runs as, 0..4294967294, or None when the caller does not say (the
    one-user-per-MPS-server rule then cannot apply to it)."""
    if not message.HasField("run_as_uid"):
        return None
    value = message.run_as_uid
    if not 0 <= value <= MAX_UID:
        raise ValidationError(field, f"must be a UID from 0 to {MAX_UID} (got {value})")
    return value


def pod(value: str, field: str) -> str:
    """``<namespace>/<name>``: a DNS-1123 label and a DNS-1123 subdomain
    (:mod:`agent.core.k8snames`); empty for none."""
    if not value:
        return value
    namespace, _, name = value.partition("/")
    for part, rule, named in (
        ("namespace", k8snames.NAMESPACE, namespace),
        ("name", k8snames.OBJECT_NAME, name),
    ):
        fault = rule.fault(named)
        if fault:
            raise ValidationError(
                field, f"must be <namespace>/<pod name>; its {part} {fault} (got {shown(value)})"
            )
    return value


# a pod UID here is the API server's own UUID: the agent finds it in cgroup paths
_WORKLOAD_RE = re.compile(
    rf"^(pod:{k8snames.UUID_PATTERN}"
    r"|container:[0-9a-f]{12,64}"
    r"|unit:[A-Za-z0-9:_.\\@-]{1,240}\.(service|scope))$"
)


def workload(value: str, field: str) -> str:
    """``pod:<pod UID>``, ``container:<container id, hex>``, ``unit:<name>.service`` or
    ``.scope``; empty for none."""
    if value and not _WORKLOAD_RE.match(clean(value, field)):
        raise ValidationError(
            field,
            f"must be pod:<pod UID>, container:<hex container id> or unit:<name>.service|.scope "
            f"(got {shown(value)})",
        )
    return value


MAX_GPUS = 100_000.0
MAX_SECONDS = 10.0 * 365 * 24 * 3600


def job(message: pb.Job, field: str) -> JobAttributes:
    return JobAttributes(
        job_type=identifier(message.job_type, f"{field}.job_type", required=False),
        model_type=identifier(message.model_type, f"{field}.model_type", required=False),
        generative=message.generative,
        requested_gpus=fraction(
            message.requested_gpus, f"{field}.requested_gpus", 0.0, MAX_GPUS, low_open=False
        ),
        declared_duration_s=fraction(
            message.declared_duration_s,
            f"{field}.declared_duration_s",
            0.0,
            MAX_SECONDS,
            low_open=False,
        ),
        scheduling_delay_s=fraction(
            message.scheduling_delay_s,
            f"{field}.scheduling_delay_s",
            0.0,
            MAX_SECONDS,
            low_open=False,
        ),
    )


MAX_COUNTERS = 64


def counters(values: Mapping[str, float], field: str) -> dict[str, float]:
    if len(values) > MAX_COUNTERS:
        raise ValidationError(field, f"holds more than {MAX_COUNTERS} counters")
    result = {}
    for name, value in values.items():
        identifier(name, f"{field} name")
        if not math.isfinite(value) or value < 0 or value > 1e15:
            raise ValidationError(f"{field}.{name}", f"must be a finite number >= 0 (got {value})")
        result[name] = float(value)
    return result


def memory(message: pb.Request, field: str) -> int:
    has_sizing = message.HasField("sizing")
    if message.memory_bytes and has_sizing:
        raise ValidationError(f"{field}.memory_bytes", "give memory_bytes or sizing, not both")
    if has_sizing:
        value = sized(sizing(message.sizing, f"{field}.sizing"), f"{field}.sizing")
    elif message.memory_bytes:
        value = message.memory_bytes
    else:
        raise ValidationError(f"{field}.memory_bytes", "is required (or sizing)")
    # the refusal names what the caller sent: the sizing, or memory_bytes
    sent, what = (f"{field}.sizing", "sizes") if has_sizing else (f"{field}.memory_bytes", "is")
    if value > MAX_MEMORY_BYTES:
        raise ValidationError(sent, f"{what} {value} bytes, larger than any device")
    if value < MIN_MEMORY_BYTES:
        raise ValidationError(
            sent, f"{what} {value} bytes; at least 1 MiB (the smallest limit MPS can express)"
        )
    return value


def sizing(message: pb.Sizing, field: str) -> SizingSpec:
    try:
        mode = Mode(text(message.mode, f"{field}.mode"))
    except ValueError:
        raise ValidationError(f"{field}.mode", "must be training or inference") from None
    return SizingSpec(
        parameters=message.parameters,
        mode=mode,
        dtype=text(message.dtype, f"{field}.dtype") or "bf16",
        layers=message.layers,
        kv_heads=message.kv_heads,
        head_dim=message.head_dim,
        context_length=message.context_length,
        concurrent_sequences=message.concurrent_sequences or 1,
    )


def sized(spec: SizingSpec, field: str) -> int:
    try:
        return size(spec).total_bytes
    except ValidationError as exc:
        raise ValidationError(f"{field}.{exc.field}", str(exc).split(": ", 1)[-1]) from exc


def ttl(value: float, field: str = "ttl_s") -> float | None:
    if value == 0:
        return None
    return fraction(value, field, 0.0, 3600.0, low_open=True)


MAX_CLAIM_BYTES = 4 * 1024 * 1024  # a ResourceClaim's JSON (etcd keeps objects far smaller)
_CLAIM_NAMES = (
    ("uid", k8snames.UID),
    ("namespace", k8snames.NAMESPACE),
    ("name", k8snames.OBJECT_NAME),
)


def claim_json(data: bytes, field: str = "claim_json") -> dict[str, Any]:
    """A ResourceClaim sent as JSON: an object of at most 4 MiB whose metadata names it
    (``uid``, ``namespace``, ``name``, by :mod:`agent.core.k8snames`: the UID becomes part
    of the driver's file names and request ids); what it allocates is read by the DRA
    driver."""
    if not data:
        raise ValidationError(field, "is required (the ResourceClaim as JSON)")
    if len(data) > MAX_CLAIM_BYTES:
        raise ValidationError(field, f"is {len(data)} bytes, more than {MAX_CLAIM_BYTES}")
    try:
        claim = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValidationError(field, "is not UTF-8 JSON") from None
    except ValueError as exc:
        raise ValidationError(field, f"is not JSON ({exc})") from None
    except RecursionError:
        raise ValidationError(field, "nests too deep to be a ResourceClaim") from None
    if not isinstance(claim, dict):
        raise ValidationError(field, f"is not a JSON object (a {type(claim).__name__})")
    meta = claim.get("metadata")
    if not isinstance(meta, dict):
        raise ValidationError(f"{field}.metadata", "is not an object")
    for key, rule in _CLAIM_NAMES:
        where = f"{field}.metadata.{key}"
        value = _string(meta.get(key), where)
        fault = rule.fault(value)
        if fault:
            raise ValidationError(
                where, f"is not a Kubernetes {key}: it {fault} (got {shown(value)})"
            )
    return claim


def _string(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(field, "is required (a string)")
    return value
