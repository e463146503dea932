"""NVIDIA's container toolkit, where the node has it: the driver's user-space libraries and
the hooks a CUDA process needs in its container (``nvidia-cdi-hook create-symlinks``,
``update-ldcache``, ``enable-cuda-compat``, ...), taken from ``nvidia-ctk cdi generate``.

The agent runs ``nvidia-ctk cdi generate --format=json`` once at its start (a subprocess
the event loop waits on, killed past a timeout) and keeps the top-level ``containerEdits``
of the spec it prints (kind ``nvidia.com/gpu``): its library mounts, hooks and environment.
Every claim's spec carries them once at its own top level (:class:`agent.dra.cdi.CdiEdits`).
What the agent gives each share itself is left out of them: the device nodes (read at each
Prepare, by minor number, :mod:`agent.dra.devnodes`) and ``NVIDIA_VISIBLE_DEVICES`` (the
share's UUID).

Where the toolkit is not there (or fails), the specs carry only the device nodes and the
MPS client environment with ``NVIDIA_VISIBLE_DEVICES=<UUID>``: a CUDA process then finds
the driver's libraries only where the NVIDIA container runtime acts on that variable (the
workload pod's ``runtimeClassName: nvidia``). :func:`doctor_check` says which case a node is.

``host_root``: where the agent sees the host's root filesystem. Other than ``/``, nvidia-ctk
looks for the driver under it (``--driver-root``) and the host paths it prints are written
back as the host's own (the prefix taken off), as NVIDIA's host-root transform does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import posixpath
import shutil
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent.core.errors import GpushareError
from agent.dra.cdi import HOOK_NAMES, CdiDeviceNode, CdiEdits, CdiHook, CdiMount

log = logging.getLogger(__name__)

GENERATE_ARGS = ("cdi", "generate", "--format=json")  # the spec on stdout, logs on stderr
NVIDIA_KIND = "nvidia.com/gpu"
TIMEOUT_S = 60.0
OWN_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES"})  # the agent sets it per share
NO_TOOLKIT_EFFECT = (
    "the claims' CDI specs carry no driver libraries or hooks: a CUDA process in a claim's "
    "container finds the driver only under the NVIDIA container runtime "
    "(runtimeClassName: nvidia on the workload pod)"
)

Which = Callable[[str], str | None]
CheckStatus = Literal["ok", "warn", "skip"]


class ToolkitError(GpushareError):
    """nvidia-ctk's output is not a spec the agent can take edits from."""


@dataclass(frozen=True, slots=True)
class Toolkit:
    """What the node's toolkit gives every claim: ``edits`` (None: nothing, ``why``)."""

    program: str  # the nvidia-ctk run ("" none found)
    edits: CdiEdits | None
    why: str = ""


def find(program: str, which: Which = shutil.which) -> str:
    """The nvidia-ctk to run: ``program`` as a path, or looked up on PATH ("" none)."""
    if not program:
        return ""
    return which(program) or ""


async def generate(
    program: str,
    *,
    host_root: str = "/",
    timeout_s: float = TIMEOUT_S,
    which: Which = shutil.which,
) -> Toolkit:
    """Run ``nvidia-ctk cdi generate`` (killed past ``timeout_s``) and take its common
    edits; what went wrong, in ``why``."""
    found = find(program, which)
    if not found:
        why = "no nvidia-ctk configured" if not program else f"{program} not found"
        return Toolkit("", None, why)
    argv = [found, *GENERATE_ARGS]
    if _root(host_root) != "/":
        argv.append(f"--driver-root={_root(host_root)}")
    command = " ".join(argv)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its children go with it
        )
    except OSError as exc:
        return Toolkit(found, None, f"cannot run {found}: {exc}")
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
    except TimeoutError:
        return Toolkit(found, None, f"{command} took more than {timeout_s:g} s")
    finally:
        if process.returncode is None:  # timed out, or cancelled
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    if process.returncode != 0:
        said = err.decode(errors="replace").strip().splitlines()[-3:]
        return Toolkit(found, None, f"{command} exited {process.returncode}: {' / '.join(said)}")
    try:
        return Toolkit(found, common_edits(out.decode(errors="replace"), host_root=host_root))
    except ToolkitError as exc:
        return Toolkit(found, None, f"{command}: {exc}")


async def load(program: str, *, host_root: str = "/", timeout_s: float = TIMEOUT_S) -> Toolkit:
    """:func:`generate`, its outcome logged (a warning where the specs go without)."""
    toolkit = await generate(program, host_root=host_root, timeout_s=timeout_s)
    if toolkit.edits is None:
        log.warning("NVIDIA container toolkit: %s; %s", toolkit.why, NO_TOOLKIT_EFFECT)
    else:
        log.info(
            "NVIDIA container toolkit %s: every claim's CDI spec carries %d mount(s) and "
            "%d hook(s) of the driver",
            toolkit.program,
            len(toolkit.edits.mounts),
            len(toolkit.edits.hooks),
        )
    return toolkit


def doctor_check(
    program: str, *, enabled: bool, simulated: bool = False, which: Which = shutil.which
) -> tuple[CheckStatus, str, str]:
    """The doctor's finding on the toolkit: (status, found, fix)."""
    if not enabled:
        return "skip", "skipped: the DRA driver is off", ""
    if simulated:
        return "skip", "skipped: a simulated node has no driver to give containers", ""
    found = find(program, which)
    if found:
        return "ok", f"{found}: the claims' CDI specs carry the driver's libraries and hooks", ""
    what = f"{program} not found" if program else "no nvidia-ctk configured"
    return (
        "warn",
        f"{what}: {NO_TOOLKIT_EFFECT}",
        "install the NVIDIA container toolkit on the node (nvidia-ctk reachable by the "
        "agent), or run GPU workload pods with runtimeClassName: nvidia",
    )


# -- the generated spec ------------------------------------------------------------------


def common_edits(text: str, *, host_root: str = "/") -> CdiEdits:
    """The top-level edits of the ``nvidia.com/gpu`` spec(s) in nvidia-ctk's output, less
    what the agent gives each share itself, host paths relative to the host's root. Device
    nodes are never taken: the agent gives each share its own, checked on the host at each
    Prepare (a node the toolkit saw at start, and is gone, would fail every container:
    runtimes refuse a device whose host path is missing); ``/dev/nvidia-modeset``, which
    the toolkit lists, is for display, not CUDA."""
    documents = _documents(text)
    specs = [d for d in documents if isinstance(d, dict) and d.get("kind") == NVIDIA_KIND]
    if not specs:
        kinds = [d.get("kind") for d in documents if isinstance(d, dict)]
        raise ToolkitError(f"no {NVIDIA_KIND} spec in its output (kinds: {kinds})")
    root = _root(host_root)
    env: list[str] = []
    mounts: list[CdiMount] = []
    hooks: list[CdiHook] = []
    for spec in specs:
        edits = _mapping(spec.get("containerEdits") or {}, "containerEdits")
        env += [e for e in _strings(edits.get("env"), "env") if _env_kept(e)]
        mounts += [_mount(m, root) for m in _list(edits.get("mounts"), "mounts")]
        for raw in _list(edits.get("deviceNodes"), "deviceNodes"):
            _node(raw, root)  # checked, not kept: device nodes are the agent's own
        hooks += [_hook(h, root) for h in _list(edits.get("hooks"), "hooks")]
    return CdiEdits(
        env=tuple(dict.fromkeys(env)),
        mounts=tuple(dict.fromkeys(mounts)),
        hooks=tuple(dict.fromkeys(hooks)),
    )


def _documents(text: str) -> list[Any]:
    """The JSON documents of ``text`` (one spec, or several one after another)."""
    decoder = json.JSONDecoder()
    documents, at = [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            break
        try:
            document, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise ToolkitError(f"its output is not JSON: {exc}") from None
        documents.append(document)
    if not documents:
        raise ToolkitError("it printed no spec")
    return documents


def _env_kept(entry: str) -> bool:
    key, equals, _ = entry.partition("=")
    if not key or not equals:
        raise ToolkitError(f"env entry {entry!r} is not KEY=VALUE")
    return key not in OWN_ENV


def _mount(raw: object, root: str) -> CdiMount:
    m = _mapping(raw, "mount")
    host, container = m.get("hostPath"), m.get("containerPath")
    if not isinstance(host, str) or not host or not isinstance(container, str) or not container:
        raise ToolkitError(f"mount {raw!r} lacks hostPath or containerPath")
    options = tuple(_strings(m.get("options"), "mount options"))
    mount_type = m.get("type") or ""
    if not isinstance(mount_type, str):
        raise ToolkitError(f"mount {raw!r} has a type that is not a string")
    options = options or ("rbind", "ro")
    return CdiMount(_host(host, root), container, "ro" in options, options, mount_type)


def _node(raw: object, root: str) -> CdiDeviceNode:
    n = _mapping(raw, "device node")
    path = n.get("path")
    if not isinstance(path, str) or not path:
        raise ToolkitError(f"device node {raw!r} has no path")
    host = n.get("hostPath") or path
    permissions = n.get("permissions") or "rw"
    if not isinstance(host, str) or not isinstance(permissions, str):
        raise ToolkitError(f"device node {raw!r} has a hostPath or permissions not a string")
    if set(permissions) - set("rwm"):
        raise ToolkitError(f"device node {raw!r} has permissions other than r, w, m")
    host = _host(host, root)
    return CdiDeviceNode(path, "" if host == path else host, permissions)


def _hook(raw: object, root: str) -> CdiHook:
    h = _mapping(raw, "hook")
    name, path = h.get("hookName"), h.get("path")
    if name not in HOOK_NAMES:
        raise ToolkitError(f"hook {raw!r} has no known hookName")
    if not isinstance(path, str) or not path:
        raise ToolkitError(f"hook {raw!r} has no path")
    timeout = h.get("timeout")
    if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)):
        raise ToolkitError(f"hook {raw!r} has a timeout that is not whole seconds")
    env = _strings(h.get("env"), "hook env")
    for entry in env:
        if "=" not in entry:
            raise ToolkitError(f"hook env entry {entry!r} is not KEY=VALUE")
    # a startContainer hook runs in the container: its path is the container's own
    path = path if name == "startContainer" else _host(path, root)
    return CdiHook(
        str(name), path, tuple(_strings(h.get("args"), "hook args")), tuple(env), timeout
    )


def _root(host_root: str) -> str:
    return posixpath.normpath(host_root or "/")


def _host(path: str, root: str) -> str:
    """``path`` as the host names it: under ``root`` (the agent's view of the host's /),
    the prefix taken off."""
    if root == "/":
        return path
    if path == root:
        return "/"
    return path[len(root) :] if path.startswith(root + "/") else path


def _mapping(raw: object, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise ToolkitError(f"{what} {raw!r} is not a mapping")
    return raw


def _list(raw: object, what: str) -> Sequence[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ToolkitError(f"{what} is not a list")
    return raw


def _strings(raw: object, what: str) -> list[str]:
    items = _list(raw, what)
    if not all(isinstance(i, str) for i in items):
        raise ToolkitError(f"{what} holds something other than strings")
    return list(items)
