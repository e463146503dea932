"""CDI specs (Container Device Interface): what a container runtime adds to a container
that was given a CDI device. One spec file per claim, named by the claim's UID so that
no two claims ever share a file (runtimes cache specs by name); written at Prepare,
removed at Unprepare. The spec is a pure function of what the claim's leases inject."""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.dra.port import DRIVER_NAME

CDI_VERSION = "0.5.0"  # device names may start with a digit (claim UIDs do)
CDI_CLASS = "claim"
CDI_KIND = f"{DRIVER_NAME}/{CDI_CLASS}"
SHM_PATH = "/dev/shm"
# Every mount: no setuid binaries and no device nodes through it, whoever else writes to the
# host directory (another claim's container, through a directory both get). /dev/shm: no
# executables either (as a runtime's own /dev/shm).
HARDENING = ("nosuid", "nodev")
SHM_HARDENING = ("noexec",)
_WEAKENING = {"suid": "nosuid", "dev": "nodev", "exec": "noexec"}
HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)


@dataclass(frozen=True, slots=True)
class CdiMount:
    host_path: str
    container_path: str
    read_only: bool = False
    options: tuple[str, ...] = ()  # as given (the NVIDIA toolkit's); () the driver's own
    mount_type: str = ""


@dataclass(frozen=True, slots=True)
class CdiDeviceNode:
    path: str  # in the container
    host_path: str = ""  # "" when the same as ``path``
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class CdiHook:
    """A hook the runtime runs for the container (``hookName`` an OCI hook point)."""

    hook_name: str
    path: str  # on the host
    args: tuple[str, ...] = ()  # argv, its first the program's name
    env: tuple[str, ...] = ()  # ``K=V``
    timeout_s: int | None = None


@dataclass(frozen=True, slots=True)
class CdiEdits:
    """Edits every container of a claim gets once, whichever of its devices it uses: the
    NVIDIA container toolkit's driver libraries and hooks. Written at the spec's level."""

    env: tuple[str, ...] = ()  # ``K=V``
    mounts: tuple[CdiMount, ...] = ()
    device_nodes: tuple[CdiDeviceNode, ...] = ()
    hooks: tuple[CdiHook, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.env or self.mounts or self.device_nodes or self.hooks)


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """The container edits of one allocated device of a claim."""

    device_name: str  # the published device's name (``gpu-0``)
    env: Mapping[str, str]
    mounts: Sequence[CdiMount] = ()
    device_nodes: Sequence[CdiDeviceNode] = ()
    hooks: Sequence[CdiHook] = ()
    common: CdiEdits | None = None  # at the spec's level, once per claim


def cdi_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def cdi_id(claim_uid: str, device_name: str) -> str:
    """The fully qualified CDI device id (``vendor/class=name``) the kubelet passes on."""
    return f"{CDI_KIND}={cdi_name(claim_uid, device_name)}"


def spec_path(cdi_dir: str | os.PathLike[str], claim_uid: str) -> Path:
    return Path(cdi_dir) / f"{DRIVER_NAME}-{CDI_CLASS}_{claim_uid}.json"


def claim_spec(claim_uid: str, devices: Sequence[CdiDevice]) -> dict[str, Any]:
    """The CDI spec of one claim: a device per allocated device, each with its own edits
    (two shares of one claim on two GPUs carry different limits); the edits every device
    shares (``common``: the driver's libraries and hooks) once at the spec's level, so that
    a container given several of the claim's devices gets them once."""
    spec: dict[str, Any] = {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {"name": cdi_name(claim_uid, d.device_name), "containerEdits": _edits(d)}
            for d in devices
        ],
    }
    common = _merged([d.common for d in devices if d.common])
    if common:
        spec["containerEdits"] = _common_edits(common)
    return spec


def mount_options(mount: CdiMount) -> list[str]:
    """A mount's options: its own (or ``rbind`` and ``ro``/``rw``), never ``suid``, ``dev``
    (nor ``exec`` on /dev/shm), always with ``nosuid,nodev`` (and ``noexec`` there)."""
    options = list(mount.options) or ["rbind", "ro" if mount.read_only else "rw"]
    hardening: tuple[str, ...] = HARDENING
    if posixpath.normpath(mount.container_path) == SHM_PATH:
        hardening += SHM_HARDENING
    options = [o for o in options if _WEAKENING.get(o) not in hardening]
    return options + [o for o in hardening if o not in options]


def _edits(device: CdiDevice) -> dict[str, Any]:
    env = [f"{k}={v}" for k, v in sorted(device.env.items())]
    return {"env": env, **_edits_json(device.mounts, device.device_nodes, device.hooks)}


def _edits_json(
    mounts: Sequence[CdiMount], nodes: Sequence[CdiDeviceNode], hooks: Sequence[CdiHook]
) -> dict[str, Any]:
    """The mounts, device nodes and hooks of a set of edits, as CDI writes them (keys only
    for what there is)."""
    edits: dict[str, Any] = {}
    if mounts:
        edits["mounts"] = [_mount(m) for m in mounts]
    if nodes:
        edits["deviceNodes"] = [_node(n) for n in nodes]
    if hooks:
        edits["hooks"] = [_hook(h) for h in hooks]
    return edits


def _merged(all_edits: Sequence[CdiEdits]) -> CdiEdits:
    """One set of edits from several, each entry once, in order."""

    def once(items: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(dict.fromkeys(items))

    return CdiEdits(
        env=once([e for edits in all_edits for e in edits.env]),
        mounts=once([m for edits in all_edits for m in edits.mounts]),
        device_nodes=once([n for edits in all_edits for n in edits.device_nodes]),
        hooks=once([h for edits in all_edits for h in edits.hooks]),
    )


def _common_edits(common: CdiEdits) -> dict[str, Any]:
    env = {"env": list(common.env)} if common.env else {}
    return {**env, **_edits_json(common.mounts, common.device_nodes, common.hooks)}


def _mount(mount: CdiMount) -> dict[str, Any]:
    out: dict[str, Any] = {
        "hostPath": mount.host_path,
        "containerPath": mount.container_path,
        "options": mount_options(mount),
    }
    if mount.mount_type:
        out["type"] = mount.mount_type
    return out


def _hook(hook: CdiHook) -> dict[str, Any]:
    out: dict[str, Any] = {"hookName": hook.hook_name, "path": hook.path}
    if hook.args:
        out["args"] = list(hook.args)
    if hook.env:
        out["env"] = list(hook.env)
    if hook.timeout_s is not None:
        out["timeout"] = hook.timeout_s
    return out


def _node(node: CdiDeviceNode) -> dict[str, str]:
    out = {"path": node.path, "permissions": node.permissions}
    if node.host_path and node.host_path != node.path:
        out["hostPath"] = node.host_path
    return out


def write_spec(
    cdi_dir: str | os.PathLike[str],
    claim_uid: str,
    spec: Mapping[str, Any],
    *,
    durable: bool = False,
) -> Path:
    """Write the claim's spec whole or not at all: a temporary file renamed over it, so a
    runtime never reads half a spec. ``durable``: the file and its rename also survive a
    power cut (both fsynced; blocking, call it off the event loop); without, a kill -9
    of the agent keeps it (the kernel holds the write) and the agent writes again at
    start what a power cut lost."""
    path = spec_path(cdi_dir, claim_uid)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")  # not *.json: runtimes skip it
    text = json.dumps(spec, sort_keys=True)  # one line: the C encoder, not the indenting one
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(text)
        if durable:
            out.flush()
            os.fsync(out.fileno())
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
    if durable:
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
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
