"""CDI, as the container runtimes' CDI cache reads and applies it: spec files in the CDI
directories, their devices resolved by id, their ``containerEdits`` applied to a container."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.kubeworld.kubelet.plugins import CdiError, FakeContainer, Obj

# -- CDI, as the container runtimes' CDI cache reads and applies it ---------------------------
# A spec file is ignored (``cdi_errors`` says why) when it does not parse, has no valid
# cdiVersion or kind, no devices, a device with a bad or repeated name or with no edits of
# its own, an env entry without "=", a device node without path, a mount without paths, or
# a cdiVersion lower than what it uses needs (0.5.0 for names starting with a digit).

CDI_VERSION_RE = re.compile(r"\d+\.\d+\.\d+")
CDI_KIND_RE = re.compile(
    r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
)
CDI_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
CDI_EDIT_KEYS = ("env", "deviceNodes", "mounts", "hooks", "intelRdt", "additionalGids")


@dataclass(frozen=True)
class CdiDevice:
    spec_path: Path
    priority: int  # index of its directory: a later one wins
    spec: Obj
    device: Obj


def load_cdi_registry(
    dirs: Iterable[Path | str],
) -> tuple[dict[str, CdiDevice], dict[str, str]]:
    """``vendor/class=name`` -> its device, from the ``*.json``/``*.yaml`` files of ``dirs``
    (no recursion; a device in a later directory replaces one in an earlier; one defined
    twice in the same directory is dropped as a conflict), and the files ignored -> why."""
    devices: dict[str, CdiDevice] = {}
    conflicts: set[str] = set()
    errors: dict[str, str] = {}
    for priority, directory in enumerate(map(Path, dirs)):
        for path in _spec_files(directory):
            try:
                spec = _read_spec(path)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                errors[str(path)] = str(exc)
                continue
            for device in spec["devices"]:
                name = f"{spec['kind']}={device['name']}"
                old = devices.get(name)
                if old is not None and old.priority == priority:
                    conflicts.add(name)
                devices[name] = CdiDevice(path, priority, spec, device)
    for name in conflicts:
        devices.pop(name, None)
    return devices, errors


def inject_cdi(
    container: FakeContainer, ids: Sequence[str], registry: Mapping[str, CdiDevice]
) -> None:
    """Apply the edits of these devices (each spec's own edits once, before its first
    device's); CdiError naming the ids that resolve to no device."""
    unresolved = [cdi_id for cdi_id in ids if cdi_id not in registry]
    if unresolved:
        raise CdiError(f"unresolvable CDI devices {', '.join(unresolved)}")
    applied: set[Path] = set()
    for cdi_id in ids:
        found = registry[cdi_id]
        if found.spec_path not in applied:
            applied.add(found.spec_path)
            _apply_edits(container, found.spec.get("containerEdits") or {})
        _apply_edits(container, found.device.get("containerEdits") or {})


def _apply_edits(container: FakeContainer, edits: Obj) -> None:
    """Env ``K=V`` (a later key wins), mounts (by container path) and device nodes (by
    path, ``hostPath`` defaulting to it), a later one replacing an earlier."""
    for entry in edits.get("env") or []:
        key, _, value = entry.partition("=")
        container.env[key] = value
    for mount in edits.get("mounts") or []:
        kept = [m for m in container.mounts if m["containerPath"] != mount["containerPath"]]
        container.mounts = [*kept, dict(mount)]
    for node in edits.get("deviceNodes") or []:
        kept = [n for n in container.device_nodes if n["path"] != node["path"]]
        container.device_nodes = [*kept, {**node, "hostPath": node.get("hostPath") or node["path"]}]


def _spec_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in (".json", ".yaml") and p.is_file())


def _read_spec(path: Path) -> Obj:
    text = path.read_text()
    spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    problem = _spec_problem(spec)
    if problem:
        raise ValueError(f"invalid CDI Spec {path.name}: {problem}")
    assert isinstance(spec, dict)
    return spec


def _spec_problem(spec: object) -> str | None:
    if not isinstance(spec, dict):
        return "not a mapping"
    version, kind = spec.get("cdiVersion"), spec.get("kind")
    if not isinstance(version, str) or not CDI_VERSION_RE.fullmatch(version):
        return f"invalid cdiVersion {version!r}"
    if not isinstance(kind, str) or not CDI_KIND_RE.fullmatch(kind):
        return f"invalid kind {kind!r}"
    problem = _devices_problem(spec.get("devices")) or _edits_problem(
        spec.get("containerEdits") or {}
    )
    if problem:
        return problem
    needed = _required_version(spec)
    if _version(version) < needed:
        return f"cdiVersion {version} is below {'.'.join(map(str, needed))}, which it needs"
    return None


def _devices_problem(devices: object) -> str | None:
    if not isinstance(devices, list) or not devices:
        return "invalid spec, no devices"
    seen = set()
    for device in devices:
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or not CDI_NAME_RE.fullmatch(name):
            return f"invalid device name {name!r}"
        if name in seen:
            return f"invalid spec, multiple device {name!r}"
        seen.add(name)
        edits = device.get("containerEdits") or {}
        if not isinstance(edits, dict) or not any(edits.get(k) for k in CDI_EDIT_KEYS):
            return f"failed add device {name!r}: invalid device, empty device edits"
        if problem := _edits_problem(edits):
            return f"invalid device {name!r}: {problem}"
    return None


def _edits_problem(edits: object) -> str | None:
    if not isinstance(edits, dict):
        return "containerEdits is not a mapping"
    for entry in edits.get("env") or []:
        if not isinstance(entry, str) or "=" not in entry:
            return f"invalid environment variable {entry!r}"
    for node in edits.get("deviceNodes") or []:
        if not isinstance(node, dict) or not node.get("path"):
            return "invalid (empty) device path"
        if set(node.get("permissions", "")) - set("rwm"):
            return f"invalid device permissions {node['permissions']!r}"
    for mount in edits.get("mounts") or []:
        if not isinstance(mount, dict) or not mount.get("hostPath"):
            return "invalid mount, empty host path"
        if not mount.get("containerPath"):
            return "invalid mount, empty container path"
    return None


def _required_version(spec: Obj) -> tuple[int, ...]:
    """The lowest cdiVersion that allows what the spec uses (device names not starting
    with a letter and device node ``hostPath``: 0.5.0; mount ``type``: 0.4.0)."""
    all_edits = [spec.get("containerEdits") or {}]
    all_edits += [d.get("containerEdits") or {} for d in spec["devices"]]
    nodes = [n for e in all_edits for n in e.get("deviceNodes") or []]
    mounts = [m for e in all_edits for m in e.get("mounts") or []]
    if any(d["name"][0] not in string.ascii_letters for d in spec["devices"]):
        return (0, 5, 0)
    if any(n.get("hostPath") for n in nodes):
        return (0, 5, 0)
    if any(m.get("type") for m in mounts):
        return (0, 4, 0)
    return (0, 3, 0)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))
