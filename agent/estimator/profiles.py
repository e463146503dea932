"""Workload profiles: a workload class's solo counters on a GPU model, its default limits,
retention floor and priority. ``profiles/*.yaml``, one profile a file:

    version: 1
    name: resnet50-train
    gpu_model: V100-SXM2-16GB      # where the counters were measured
    counters: {sm_active: 0.82, dram_active: 0.45, gpu_util: 95, mem_util: 45}
    share_counters:                # optional: measured alone at MPS thread shares
      50: {sm_active: 0.48, dram_active: 0.31}
    memory: 6GiB                   # default memory limit
    thread_pct: 50                 # default active-thread percentage
    retention_floor: 0.8           # protect it: keep at least 80% of its solo speed
    priority: burstable

Errors name the file and the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.core.errors import UnitError, ValidationError
from agent.core.types import PriorityClass
from agent.core.units import parse_bytes

KEYS = {
    "version",
    "name",
    "gpu_model",
    "counters",
    "share_counters",
    "memory",
    "thread_pct",
    "retention_floor",
    "priority",
}


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    gpu_model: str
    counters: dict[str, float] = field(default_factory=dict)
    share_counters: dict[float, dict[str, float]] = field(default_factory=dict)
    memory_bytes: int = 0
    thread_pct: float = 100.0
    retention_floor: float | None = None
    priority: PriorityClass = PriorityClass.BURSTABLE


def parse_profile(text: str, source: str) -> Profile:
    try:
        body = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValidationError(source, f"not valid YAML: {exc}") from exc
    if not isinstance(body, dict):
        raise ValidationError(source, "must be a mapping")
    unknown = set(body) - KEYS
    if unknown:
        raise ValidationError(f"{source}: {sorted(map(str, unknown))[0]}", "unknown key")
    if body.get("version") != 1:
        raise ValidationError(f"{source}: version", "must be 1")
    return Profile(
        name=_text(body, "name", source),
        gpu_model=_text(body, "gpu_model", source),
        counters=_counters(body.get("counters"), source),
        share_counters=_shares(body.get("share_counters", {}), source),
        memory_bytes=_memory(body.get("memory", "0"), source),
        thread_pct=_number(body.get("thread_pct", 100), f"{source}: thread_pct", 0.0, 100.0),
        retention_floor=(
            None
            if body.get("retention_floor") is None
            else _number(body["retention_floor"], f"{source}: retention_floor", 0.0, 1.0)
        ),
        priority=_priority(body.get("priority", "burstable"), source),
    )


def load_profiles(directory: Path) -> dict[str, Profile]:
    """Every ``*.yaml`` in ``directory`` by name; a missing directory holds none."""
    profiles: dict[str, Profile] = {}
    if not directory.is_dir():
        return profiles
    for path in sorted(directory.glob("*.yaml")):
        profile = parse_profile(path.read_text(), path.name)
        if profile.name in profiles:
            raise ValidationError(
                f"{path.name}: name", f"profile {profile.name!r} is defined twice"
            )
        profiles[profile.name] = profile
    return profiles


def _text(body: dict[str, Any], key: str, source: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ValidationError(f"{source}: {key}", "required, a non-empty string")
    return value


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(where, f"must be a number (got {value!r})")
    if not low <= float(value) <= high:
        raise ValidationError(where, f"must be within [{low:g}, {high:g}]")
    return float(value)


def _counters(value: Any, source: str) -> dict[str, float]:
    if not isinstance(value, dict) or not value:
        raise ValidationError(f"{source}: counters", "required: the workload's solo counters")
    return {str(k): _number(v, f"{source}: counters.{k}", 0.0, 1e15) for k, v in value.items()}


def _shares(value: Any, source: str) -> dict[float, dict[str, float]]:
    if not isinstance(value, dict):
        raise ValidationError(
            f"{source}: share_counters", "must map thread percentages to counters"
        )
    shares = {}
    for key, counters in value.items():
        pct = _number(key, f"{source}: share_counters.{key}", 1.0, 100.0)
        shares[pct] = _counters(counters, f"{source}: share_counters.{key}")
    return shares


def _memory(value: Any, source: str) -> int:
    try:
        return parse_bytes(str(value))
    except UnitError as exc:
        raise ValidationError(f"{source}: memory", str(exc)) from exc


def _priority(value: Any, source: str) -> PriorityClass:
    try:
        return PriorityClass(value)
    except ValueError:
        raise ValidationError(
            f"{source}: priority", "must be guaranteed, burstable or best-effort"
        ) from None
