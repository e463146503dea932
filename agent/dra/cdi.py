"""CDI specs (Container Device Interface): what a container runtime adds to a container
that was given a CDI device. One spec file per claim, named by the claim's UID so that
no two claims ever share a file (runtimes cache specs by name); written at Prepare,
removed at Unprepare. The spec is a pure function of what the claim's leases inject."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.dra.port import DRIVER_NAME

CDI_VERSION = "0.5.0"  # device names may start with a digit (claim UIDs do)
CDI_CLASS = "claim"
CDI_KIND = f"{DRIVER_NAME}/{CDI_CLASS}"


@dataclass(frozen=True, slots=True)
class CdiMount:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class CdiDeviceNode:
    path: str  # in the container
    host_path: str = ""  # "" when the same as ``path``
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """The container edits of one allocated device of a claim."""

    device_name: str  # the published device's name (``gpu-0``)
    env: Mapping[str, str]
    mounts: Sequence[CdiMount] = ()
    device_nodes: Sequence[CdiDeviceNode] = ()


def cdi_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def cdi_id(claim_uid: str, device_name: str) -> str:
    """The fully qualified CDI device id (``vendor/class=name``) the kubelet passes on."""
    return f"{CDI_KIND}={cdi_name(claim_uid, device_name)}"


def spec_path(cdi_dir: str | os.PathLike[str], claim_uid: str) -> Path:
    return Path(cdi_dir) / f"{DRIVER_NAME}-{CDI_CLASS}_{claim_uid}.json"


def claim_spec(claim_uid: str, devices: Sequence[CdiDevice]) -> dict[str, Any]:
    """The CDI spec of one claim: a device per allocated device, each with its own edits
    (two shares of one claim on two GPUs carry different limits, so nothing is spec-wide)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {"name": cdi_name(claim_uid, d.device_name), "containerEdits": _edits(d)}
            for d in devices
        ],
    }


def _edits(device: CdiDevice) -> dict[str, Any]:
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(device.env.items())]}
    if device.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in device.mounts
        ]
    if device.device_nodes:
        edits["deviceNodes"] = [_node(n) for n in device.device_nodes]
    return edits


def _node(node: CdiDeviceNode) -> dict[str, str]:
    out = {"path": node.path, "permissions": node.permissions}
    if node.host_path and node.host_path != node.path:
        out["hostPath"] = node.host_path
    return out


def write_spec(cdi_dir: str | os.PathLike[str], claim_uid: str, spec: Mapping[str, Any]) -> Path:
    """Write the claim's spec whole or not at all (a temporary file renamed over it, after
    an fsync: a runtime never reads half a spec, a crash never leaves one)."""
    path = spec_path(cdi_dir, claim_uid)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")  # not *.json: runtimes skip it
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(spec, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
    return path


def remove_spec(cdi_dir: str | os.PathLike[str], claim_uid: str) -> bool:
    """Remove the claim's spec; False when there was none."""
    try:
        spec_path(cdi_dir, claim_uid).unlink()
    except FileNotFoundError:
        return False
    return True


def spec_claims(cdi_dir: str | os.PathLike[str]) -> set[str]:
    """The claim UIDs that have a spec of this driver in ``cdi_dir``."""
    prefix, suffix = f"{DRIVER_NAME}-{CDI_CLASS}_", ".json"
    with contextlib.suppress(FileNotFoundError):
        return {
            p.name[len(prefix) : -len(suffix)]
            for p in Path(cdi_dir).iterdir()
            if p.name.startswith(prefix) and p.name.endswith(suffix)
        }
    return set()
