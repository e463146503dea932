"""Co-location run records (JSON Lines), read strictly: a bad record names its line and field.

    {"gpu": {"model": "V100-SXM2-16GB", "memory_bytes": 17179869184},
     "target": {"workload": "resnet50-bs32", "thread_pct": 100, "memory_bytes": 4294967296,
                "counters": {"gpu_util": 92.0, "mem_util": 41.0, "fb_used_bytes": 3.2e9}},
     "peers": [{"workload": "lstm-bs64", "thread_pct": 100, "memory_bytes": 2147483648,
                "counters": {"gpu_util": 55.0, "mem_util": 20.0, "fb_used_bytes": 1.9e9}}],
     "device_counters": {"gpu_util": 98.0, "mem_util": 60.0, "fb_used_bytes": 5.1e9},
     "retention": 0.87}

Pure: parses text, does no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.core.errors import ValidationError


@dataclass(frozen=True, slots=True)
class Workload:
    workload: str
    thread_pct: float
    memory_bytes: int
    counters: Mapping[str, float] = field(default_factory=dict)
    family: str = ""  # the workload's family (model architecture); derived from its name if ""
    # Counters measured alone at other thread percentages (MPS shares): {pct: counters}.
    share_counters: Mapping[float, Mapping[str, float]] = field(default_factory=dict)


def counters_at_share(workload: Workload) -> Mapping[str, float]:
    """The workload's counters at its own thread percentage: those measured at that share
    (``share_counters``: the exact share, else the nearest one measured) when it has any,
    else its ``counters``."""
    shares = workload.share_counters
    if not shares:
        return workload.counters
    nearest = min(shares, key=lambda pct: (abs(pct - workload.thread_pct), -pct))
    return {**workload.counters, **shares[nearest]}


# A batch-size suffix: "resnet50-bs32", "bert_b16", "ResNet-50 (batch size 128)".
_BATCH = re.compile(r"(\s*\(.*\)|[-_ ]+(bs|b|batch[-_ ]?size)[-_ ]?\d+)$", re.IGNORECASE)


def family_of(workload: Workload) -> str:
    """The workload's family: its ``family`` field, else its name less a batch-size suffix,
    lower case. Cross-validation holds whole families out."""
    if workload.family:
        return workload.family
    name = workload.workload.strip()
    while True:
        shorter = _BATCH.sub("", name)
        if shorter == name or not shorter:
            return name.lower()
        name = shorter


@dataclass(frozen=True, slots=True)
class Record:
    gpu_model: str
    gpu_memory_bytes: int
    target: Workload
    peers: tuple[Workload, ...] = ()
    device_counters: Mapping[str, float] | None = None
    retention: float | None = None
    # What retention is set against: "device", the target alone on the whole device (the
    # default; `gpushare profile`'s solo runs), or "share", the target alone at its own
    # thread share (the node's progress reports: the interference alone).
    retention_basis: str = "device"


BASES = ("device", "share")


def parse_lines(lines: Iterable[str], *, need_retention: bool) -> list[Record]:
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            document = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"line {number}", f"not JSON: {exc.msg}") from exc
        records.append(parse_record(document, f"line {number}", need_retention=need_retention))
    return records


def parse_record(document: Any, where: str, *, need_retention: bool) -> Record:
    body = _mapping(document, where)
    gpu = _mapping(body.get("gpu"), f"{where}: gpu")
    retention = body.get("retention")
    if retention is not None or need_retention:
        retention = _number(retention, f"{where}: retention", low=0.0, high=10.0)
    peers = body.get("peers", [])
    if not isinstance(peers, list):
        raise ValidationError(f"{where}: peers", "must be a list")
    device = body.get("device_counters")
    return Record(
        gpu_model=_text(gpu.get("model"), f"{where}: gpu.model"),
        gpu_memory_bytes=int(_number(gpu.get("memory_bytes"), f"{where}: gpu.memory_bytes", low=1)),
        target=_workload(body.get("target"), f"{where}: target"),
        peers=tuple(_workload(p, f"{where}: peers[{i}]") for i, p in enumerate(peers)),
        device_counters=None if device is None else _counters(device, f"{where}: device_counters"),
        retention=retention,
        retention_basis=_basis(body.get("retention_basis", "device"), f"{where}: retention_basis"),
    )


def _basis(value: Any, where: str) -> str:
    if value not in BASES:
        raise ValidationError(where, f"must be one of {', '.join(BASES)} (got {value!r})")
    return str(value)


def _workload(value: Any, where: str) -> Workload:
    body = _mapping(value, where)
    return Workload(
        workload=_text(body.get("workload"), f"{where}.workload"),
        thread_pct=_number(
            body.get("thread_pct", 100.0), f"{where}.thread_pct", low=0.0, high=100.0
        ),
        memory_bytes=int(_number(body.get("memory_bytes", 0), f"{where}.memory_bytes", low=0)),
        counters=_counters(body.get("counters", {}), f"{where}.counters"),
        family=_family(body.get("family"), f"{where}.family"),
        share_counters=_shares(body.get("share_counters", {}), f"{where}.share_counters"),
    )


def _shares(value: Any, where: str) -> dict[float, dict[str, float]]:
    body = _mapping(value, where)
    shares = {}
    for key, counters in body.items():
        try:
            pct = float(key)
        except ValueError:
            raise ValidationError(f"{where}.{key}", "must be a thread percentage") from None
        if not math.isfinite(pct) or not 0.0 < pct <= 100.0:
            raise ValidationError(f"{where}.{key}", "must be a thread percentage in (0, 100]")
        shares[pct] = _counters(counters, f"{where}.{key}")
    return shares


def _family(value: Any, where: str) -> str:
    return "" if value is None else _text(value, where)


def _counters(value: Any, where: str) -> dict[str, float]:
    body = _mapping(value, where)
    return {str(k): _number(v, f"{where}.{k}") for k, v in body.items()}


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(where, "must be an object")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(where, "must be a non-empty string")
    return value


def _number(
    value: Any, where: str, *, low: float | None = None, high: float | None = None
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(where, f"must be a number (got {value!r})")
    number = float(value)
    if not math.isfinite(number):
        raise ValidationError(where, "must be finite")
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValidationError(where, f"must be within [{low}, {high}] (got {number:g})")
    return number


def to_json(record: Record, **extra: float) -> str:
    """A record as one JSON line, with ``extra`` fields (predictions) added."""

    def workload(w: Workload) -> dict[str, Any]:
        body = {
            "workload": w.workload,
            "thread_pct": w.thread_pct,
            "memory_bytes": w.memory_bytes,
            "counters": dict(w.counters),
        }
        if w.share_counters:
            body["share_counters"] = {f"{k:g}": dict(v) for k, v in w.share_counters.items()}
        return {**body, "family": w.family} if w.family else body

    document: dict[str, Any] = {
        "gpu": {"model": record.gpu_model, "memory_bytes": record.gpu_memory_bytes},
        "target": workload(record.target),
        "peers": [workload(p) for p in record.peers],
    }
    if record.device_counters is not None:
        document["device_counters"] = dict(record.device_counters)
    if record.retention is not None:
        document["retention"] = record.retention
    if record.retention_basis != "device":
        document["retention_basis"] = record.retention_basis
    document.update(extra)
    return json.dumps(document)
