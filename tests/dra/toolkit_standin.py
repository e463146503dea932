"""Stand-ins for NVIDIA's container toolkit, for a machine without it: an ``nvidia-ctk``
whose ``cdi generate --format=json`` prints a spec in the shape the real one prints (the
``nvidia.com/gpu`` kind, per-GPU devices and ``all``, the top-level edits: environment,
control device nodes, ``nvidia-cdi-hook`` hooks, library mounts; its log on stderr), and an
``nvidia-cdi-hook`` that records each call: its arguments and the OCI state it is given on
stdin."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
DRIVER = "570.133.20"


@dataclass(frozen=True)
class StandIn:
    nvidia_ctk: Path  # the program to run
    hook: Path  # the stand-in nvidia-cdi-hook its spec names
    calls: Path  # one line per nvidia-cdi-hook call: its arguments, tab-separated
    states: Path  # the OCI state each call was given, one JSON document per line
    ctk_calls: Path  # one line per nvidia-ctk call: its arguments
    library: Path  # the host file the spec mounts as libcuda


def generated_spec(hook: str, library: str, driver_root: str = "") -> dict[str, Any]:
    """A spec as ``nvidia-ctk cdi generate`` prints it for a node of one GPU."""
    root = driver_root.rstrip("/")

    def hook_call(*args: str) -> dict[str, Any]:
        return {
            "hookName": "createContainer",
            "path": hook,
            "args": ["nvidia-cdi-hook", *args],
            "env": ["NVIDIA_CTK_DEBUG=false"],
        }

    node = {"path": "/dev/nvidia0", "hostPath": f"{root}/dev/nvidia0"}
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [node]}},
            {"name": "all", "containerEdits": {"deviceNodes": [node]}},
        ],
        "containerEdits": {
            "env": [f"NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}", "NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [
                {"path": "/dev/nvidia-modeset", "hostPath": f"{root}/dev/nvidia-modeset"},
                {"path": "/dev/nvidia-uvm", "hostPath": f"{root}/dev/nvidia-uvm"},
                {"path": "/dev/nvidiactl", "hostPath": f"{root}/dev/nvidiactl"},
            ],
            "hooks": [
                hook_call("create-symlinks", "--link", f"libcuda.so.1::{LIB_DIR}/libcuda.so"),
                hook_call("enable-cuda-compat", f"--host-driver-version={DRIVER}"),
                hook_call("update-ldcache", "--folder", LIB_DIR),
                hook_call("disable-device-node-modification"),
            ],
            "mounts": [
                {
                    "hostPath": f"{root}{library}",
                    "containerPath": f"{LIB_DIR}/libcuda.so.{DRIVER}",
                    "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
                }
            ],
        },
    }


def make_standin(
    directory: Path, *, exit_code: int = 0, sleep_s: float = 0, output: str | None = None
) -> StandIn:
    """Write the stand-ins into ``directory``. ``output``: what nvidia-ctk prints instead
    of the spec; ``exit_code`` and ``sleep_s``: how it ends."""
    directory.mkdir(parents=True, exist_ok=True)
    calls, states = directory / "hook-calls", directory / "hook-states"
    ctk_calls = directory / "ctk-calls"
    hook = directory / "nvidia-cdi-hook"
    library = directory / f"libcuda.so.{DRIVER}"
    library.write_bytes(b"\x7fELF stand-in")
    _script(
        hook,
        f"""
(IFS="$(printf '\\t')"; echo "$*") >> {shlex.quote(str(calls))}
tr -d '\\n' >> {shlex.quote(str(states))}
echo >> {shlex.quote(str(states))}
""",
    )
    spec = directory / "spec.json"
    nvidia_ctk = directory / "nvidia-ctk"
    root_of = 'root=""; for a in "$@"; do case "$a" in --driver-root=*) root="${a#*=}";; esac; done'
    if output is None:
        spec.write_text(json.dumps(generated_spec(str(hook), str(library)), indent=2))
        rooted = directory / "rooted.json"  # see rooted_spec
        body = f"""
{root_of}
if [ -n "$root" ]; then cat {shlex.quote(str(rooted))}; else cat {shlex.quote(str(spec))}; fi
"""
    else:
        spec.write_text(output)
        body = f"cat {shlex.quote(str(spec))}"
    _script(
        nvidia_ctk,
        f"""
echo "$*" >> {shlex.quote(str(ctk_calls))}
[ "$1 $2" = "cdi generate" ] || {{ echo "unexpected call: $*" >&2; exit 2; }}
echo 'time="2026-12-06T00:00:00Z" level=info msg="Auto-detected mode as '"'"'nvml'"'"'"' >&2
sleep {sleep_s}
{body}
echo 'time="2026-12-06T00:00:01Z" level=info msg="Generated CDI spec with version 0.5.0"' >&2
[ {exit_code} -eq 0 ] ||
  echo 'level=error msg="failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND"' >&2
exit {exit_code}
""",
    )
    return StandIn(nvidia_ctk, hook, calls, states, ctk_calls, library)


def rooted_spec(standin: StandIn, host_root: Path) -> None:
    """What the stand-in prints when told ``--driver-root=<host_root>``: every host path
    under that root (the hook's, the library's, the nodes')."""
    spec = generated_spec(
        f"{host_root}{standin.hook}", str(standin.library), driver_root=str(host_root)
    )
    (standin.nvidia_ctk.parent / "rooted.json").write_text(json.dumps(spec))


def hook_calls(standin: StandIn) -> list[list[str]]:
    if not standin.calls.exists():
        return []
    return [line.split("\t") for line in standin.calls.read_text().splitlines()]


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body.lstrip())
    os.chmod(path, 0o755)
