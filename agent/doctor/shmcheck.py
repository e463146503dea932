"""The doctor's mps-shm check: each device's MPS servers and containers with a bounded tmpfs
of their own (mps.shm_root), closed to other users and apart from the one shared directory
that daemons without their own (legacy, or a starter that could not isolate them) give
their containers; without mps.shm_root that one directory for every tenant is a warning.
A pure function of :class:`~agent.doctor.facts.ShmFacts`."""

from __future__ import annotations

import stat

from agent.core.units import format_bytes
from agent.doctor.checks import listed
from agent.doctor.facts import DeviceShm, Finding, ShmFacts


def check_shm(facts: ShmFacts) -> Finding:
    """Each device's MPS servers and containers have a tmpfs of their own (mps.shm_root);
    else, or for a daemon without one, one host directory shared at /dev/shm."""
    name = "mps-shm"
    if not facts.kubelet_enabled and not facts.dra_enabled:
        return Finding(
            "skip",
            name,
            "no Kubernetes path (kubelet.enabled and dra.enabled are off): clients on the "
            "host share its /dev/shm with the MPS server",
        )
    if facts.kubelet_shm_dir and facts.dra_shm_dir and facts.kubelet_shm_dir != facts.dra_shm_dir:
        return Finding(
            "fail",
            name,
            f"kubelet.shm_dir {facts.kubelet_shm_dir} and dra.shm_dir {facts.dra_shm_dir} differ",
            "set both to the host directory the mps-host pod mounts at /dev/shm",
        )
    if facts.shm_root:
        return _check_own_shm(facts)
    shared = _check_shared_shm(facts)
    if shared.status != "ok":
        return shared
    return Finding(
        "warn",
        name,
        f"{shared.found}: one /dev/shm for every tenant of the node (mps.shm_root is empty), "
        "so any of them reads and fills what the others' MPS servers and clients keep there",
        "set mps.shm_root (e.g. /run/gpushare/shm): a tmpfs per device, for its trust domain alone",
    )


def _check_shared_shm(facts: ShmFacts) -> Finding:
    """The one directory of clients whose servers have none of their own."""
    name = "mps-shm"
    keys = [
        key
        for key, on, value in (
            ("kubelet.shm_dir", facts.kubelet_enabled, facts.kubelet_shm_dir),
            ("dra.shm_dir", facts.dra_enabled, facts.dra_shm_dir),
        )
        if on and not value
    ]
    if keys:
        return Finding(
            "warn",
            name,
            f"{' and '.join(keys)} empty: each client container gets a /dev/shm of its own, "
            "which the MPS server does not share",
            f"set {' and '.join(keys)} to the host directory the mps-host pod mounts at /dev/shm",
        )
    d = facts.directory
    if d is None:  # pragma: no cover - gathered whenever a directory is configured
        return Finding("skip", name, "no shm directory configured")
    named = f"({_shared_keys(facts)})"
    if d.error:
        return Finding("fail", name, f"cannot look at {d.path} {named}: {d.error}")
    make = f"mkdir -p {d.path} && chmod 1777 {d.path} (or a tmpfs of the size clients need)"
    if not d.exists and facts.in_pod:
        return Finding(
            "fail",
            name,
            f"{d.path} is not in this pod {named}: the /dev/shm of the containers given it "
            "cannot be checked",
            f"mount the host's {d.path} into the agent's pod at the same path (hostPath, "
            "read-only will do: the chart's shm.hostPath, which the mps-host pod mounts at "
            f"/dev/shm), or run the doctor on the host; where the host lacks it too: {make}",
        )
    if not d.exists:
        return Finding("fail", name, f"{d.path} does not exist {named}", make)
    if not d.is_dir:
        return Finding("fail", name, f"{d.path} is not a directory {named}", make)
    where = " (on the host)" if facts.in_pod else ""
    by_group = facts.client_gid is not None and d.gid == facts.client_gid and d.mode & 0o020
    if not d.mode & 0o002 and not by_group:
        return Finding(
            "fail",
            name,
            f"{d.path} is {d.shown()}: MPS clients of other users cannot create their "
            "segments in it",
            f"chmod 1777 {d.path}{where}",
        )
    if d.mode & 0o002 and not d.mode & stat.S_ISVTX:
        return Finding(
            "warn",
            name,
            f"{d.path} is world-writable without the sticky bit ({d.mode:04o}): clients may "
            "remove each other's segments",
            f"chmod 1777 {d.path}{where}",
        )
    return Finding("ok", name, f"{d.path} exists, mode {d.mode:04o}")


def _shared_keys(facts: ShmFacts) -> str:
    """The settings that name the shared directory on the enabled paths."""
    keys = [
        key
        for key, on, value in (
            ("kubelet.shm_dir", facts.kubelet_enabled, facts.kubelet_shm_dir),
            ("dra.shm_dir", facts.dra_enabled, facts.dra_shm_dir),
        )
        if on and value
    ]
    return " and ".join(keys)


def _check_own_shm(facts: ShmFacts) -> Finding:
    """mps.shm_root: closed to other users, apart from the shared directory, and each
    device's daemon with a bounded tmpfs of its own, nosuid, nodev, noexec."""
    name, root = "mps-shm", facts.shm_root
    if facts.root is not None and facts.root.error:
        return Finding("fail", name, f"cannot look at {root}: {facts.root.error}")
    failures = _root_problems(facts) + _device_problems(facts)
    if failures:
        fixes = " && ".join(dict.fromkeys(fix for _problem, fix in failures))
        return Finding("fail", name, listed([problem for problem, _fix in failures]), fixes)
    warnings = [f"{d.uuid}: {d.reason}" for d in facts.devices if d.state in ("shared", "legacy")]
    if warnings:
        which, shared = listed(warnings), _check_shared_shm(facts)
        if shared.status in ("fail", "warn"):
            return Finding(shared.status, name, f"{which}; {shared.found}", shared.fix)
        together = facts.directory.path if facts.directory else "one directory"
        return Finding(
            "warn",
            name,
            f"{which}: the containers of these devices share {together}",
            "a legacy daemon gets its own once its device has no lease; a shared one needs "
            "its starter (the agent, or the MPS host) to run as root with mount namespaces "
            "allowed",
        )
    own = [d for d in facts.devices if d.state == "own"]
    if not own:
        return Finding("ok", name, f"no MPS daemon runs yet; each will have a tmpfs under {root}")
    sizes = sorted({format_bytes(d.size_bytes or 0) for d in own})
    return Finding(
        "ok",
        name,
        f"{len(own)} device(s) with a tmpfs of their own under {root} ({', '.join(sizes)}, "
        "nosuid,nodev,noexec), each for one trust domain at a time",
    )


def _root_problems(facts: ShmFacts) -> list[tuple[str, str]]:
    root, found = facts.shm_root, []
    named = (("kubelet.shm_dir", facts.kubelet_shm_dir), ("dra.shm_dir", facts.dra_shm_dir))
    for key, shared in named:
        if shared and _inside(root, shared):
            found.append(
                (
                    f"mps.shm_root {root} is inside {key} {shared}: a container given {shared} "
                    "sees every device's memory",
                    f"set mps.shm_root outside {shared}",
                )
            )
    r = facts.root
    if r is not None and r.exists and r.mode & 0o077:
        found.append(
            (
                f"{root} is open to other users ({r.shown()})",
                f"chmod 0700 {root} (the agent or the MPS host makes it so at start)",
            )
        )
    return found


def _device_problems(facts: ShmFacts) -> list[tuple[str, str]]:
    found = []
    for d in facts.devices:
        problem = _tmpfs_problem(d) if d.state == "own" else ""
        if problem:
            found.append((problem, "restart the daemon's starter (the agent, or the MPS host)"))
        elif d.state == "mismatch":
            found.append((f"{d.uuid}: {d.reason}", _mismatch_fix(facts)))
    return found


def _mismatch_fix(facts: ShmFacts) -> str:
    if facts.in_pod:
        return (
            f"mount the host directory that holds {facts.shm_root} into the agent's pod with "
            "mountPropagation Bidirectional (or HostToContainer), so that it sees the tmpfs "
            "the mps-host pod mounts there (Bidirectional: the chart's run volume)"
        )
    return (
        f"mount {facts.shm_root} the same way where the agent and the MPS host run "
        "(Bidirectional where the tmpfs is made)"
    )


def _inside(path: str, directory: str) -> bool:
    path, directory = path.rstrip("/"), directory.rstrip("/")
    return path == directory or path.startswith(directory + "/")


def _tmpfs_problem(d: DeviceShm) -> str:
    if d.fstype != "tmpfs":
        what = f"a {d.fstype} mount" if d.fstype else "no mount"
        return f"{d.directory} is {what}, not a tmpfs: its daemon's memory is not bounded"
    if not d.size_bytes:
        return f"{d.directory} is a tmpfs without a size"
    if d.lacks:
        return f"{d.directory} is mounted without {','.join(d.lacks)}"
    return ""
