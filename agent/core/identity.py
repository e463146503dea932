"""Which lease a process belongs to, by facts the tenant cannot set. Pure: text in, facts out.

A process's cgroup (``/proc/<pid>/cgroup``) is set by the kubelet, the container runtime or
systemd, not by the tenant: it names the pod UID and container id under Kubernetes, the
systemd unit otherwise. A lease granted for a workload (``Lease.workload``: ``pod:<uid>``,
``container:<id>``, ``unit:<name>``) owns exactly the processes whose cgroup matches it.
``GPUSHARE_LEASE_ID`` in a process's environment is a hint the tenant sets: it picks among
the leases its cgroup matches, it attributes a process to a lease bound to no workload, and
it is never trusted against the cgroup (a mismatch, see :func:`attribute`).

Only the trusted part of a cgroup path is read: walking from the root, everything below the
first container segment or the first systemd unit (``*.service``, ``*.scope``) is delegated
to whoever runs there and may be named at will, so a pod or container segment down there
is not believed. The container runtimes' own services (containerd, docker, CRI-O, kubelet)
are root's and are walked through, since cgroup v1 hierarchies may hold pods below them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.core.lease import LEASE_ID_PATTERN

# ``kubepods-burstable-pod<uid, "_" for "-">.slice``, ``kubelet-kubepods-pod<uid>.slice``
_POD_SLICE = re.compile(r"^(?:[a-z]+-)*kubepods(?:-[a-z]+)*-pod([0-9a-f_]{32,36})\.slice$")
_POD_DIR = re.compile(r"^pod([0-9a-f-]{32,36})$")  # cgroupfs: /kubepods/burstable/pod<uid>
_CONTAINER_SCOPE = re.compile(r"^(?:cri-containerd|crio|docker|libpod)-([0-9a-f]{64})\.scope$")
_CONTAINER_DIR = re.compile(r"^([0-9a-f]{64})$")  # cgroupfs: a 64-hex segment
_UNIT = re.compile(r"^[A-Za-z0-9:_.\\@-]+\.(?:service|scope)$")
_LEASE_ID = re.compile(f"({LEASE_ID_PATTERN})")
RUNTIME_SERVICES = frozenset(
    {"containerd.service", "docker.service", "crio.service", "kubelet.service", "k3s.service"}
)
# v1 hierarchies, most telling first ("" is the v2 unified hierarchy)
_HIERARCHY_ORDER = ("name=systemd", "", "memory", "pids", "cpu,cpuacct", "cpuacct,cpu")
MIN_CONTAINER_PREFIX = 12
MAX_MARKER_BYTES = 256


@dataclass(frozen=True, slots=True)
class CgroupFacts:
    """What a process's cgroup says of it (``None``: not said)."""

    pod_uid: str | None = None  # lower case, with dashes
    container_id: str | None = None  # 64 hex
    unit: str | None = None  # the systemd unit, outside Kubernetes pods
    lease_id: str | None = None  # an ``l-...`` id in the path: a hint, like the marker

    def describe(self) -> str:
        said = [
            f"{name} {value}"
            for name, value in (
                ("pod", self.pod_uid),
                ("container", self.container_id),
                ("unit", self.unit),
            )
            if value
        ]
        return ", ".join(said) or "no pod, container or unit"


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    pid: int
    start_time_ticks: int  # field 22 of /proc/<pid>/stat: tells a reused PID apart
    cgroup: CgroupFacts
    hint: str | None = None  # GPUSHARE_LEASE_ID as the process set it: untrusted


@dataclass(frozen=True, slots=True)
class Attribution:
    lease_id: str | None  # the lease the process belongs to, if any
    by_cgroup: bool = False  # its cgroup matches that lease's workload (else: the hint only)
    mismatch: str | None = None  # the hint named a lease its cgroup contradicts


NO_LEASE = Attribution(None)


def start_time_ticks(stat: str) -> int:
    """Field 22 (starttime, clock ticks after boot) of a ``/proc/<pid>/stat`` line. The
    command name (field 2) is in parentheses and may hold spaces and ``)``: the fields
    after it start past the last ``)``."""
    fields = stat[stat.rindex(")") + 1 :].split()
    return int(fields[22 - 3])


def marker_from_chunks(chunks: Iterable[bytes], key: str) -> str | None:
    """The value of ``key`` in a NUL-separated environment read in chunks, keeping nothing
    else: an entry is buffered only while it may still be ``key=`` (and is short)."""
    prefix = f"{key}=".encode()
    limit = len(prefix) + MAX_MARKER_BYTES
    entry, skipping = b"", False
    for chunk in chunks:
        *ended, rest = chunk.split(b"\0")
        for piece in ended:
            whole = b"" if skipping else entry + piece
            if whole.startswith(prefix) and len(whole) <= limit:
                return _decoded(whole[len(prefix) :])
            entry, skipping = b"", False
        if not skipping:
            entry += rest
            if not _may_be_marker(entry, prefix, limit):
                entry, skipping = b"", True
    if entry.startswith(prefix):
        return _decoded(entry[len(prefix) :])
    return None


def _may_be_marker(entry: bytes, prefix: bytes, limit: int) -> bool:
    return len(entry) <= limit and (prefix.startswith(entry) or entry.startswith(prefix))


def _decoded(value: bytes) -> str | None:
    try:
        return value.decode("ascii") or None
    except UnicodeDecodeError:
        return None


def cgroup_path(text: str) -> str:
    """The path to read from a ``/proc/<pid>/cgroup`` file (v2 ``0::/...`` or v1 lines):
    the first of :data:`_HIERARCHY_ORDER` that is not the root, else any such one."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3 and parts[2] not in ("", "/"):
            paths.setdefault(parts[1], parts[2])
    for controllers in _HIERARCHY_ORDER:
        if controllers in paths:
            return paths[controllers]
    return next(iter(paths.values()), "/")


def parse_cgroup(text: str) -> CgroupFacts:
    """The pod UID, container id and systemd unit a ``/proc/<pid>/cgroup`` file names."""
    path = cgroup_path(text)
    pod: str | None = None
    container: str | None = None
    unit: str | None = None
    runtime: str | None = None  # a container runtime's service walked through
    kubepods = False
    for segment in _segments(path):
        kubepods = kubepods or "kubepods" in segment
        found_pod, container = _kube_segment(segment, kubepods)
        pod = pod or found_pod
        if container:
            unit = segment if pod is None and _UNIT.match(segment) else None
            break
        if segment in RUNTIME_SERVICES:
            runtime = segment
        elif _UNIT.match(segment):
            unit = None if pod else segment
            break
    if pod is None and container is None and unit is None:
        unit = runtime
    match = _LEASE_ID.search(path)
    return CgroupFacts(pod, container, unit, match.group(1) if match else None)


def _segments(path: str) -> list[str]:
    """Path segments; a ``slice:runtime:id`` segment (containerd, cgroup v1) is split."""
    out: list[str] = []
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            continue
        parts = segment.split(":")
        if len(parts) == 3 and parts[0].endswith(".slice"):
            out += [parts[0], f"{parts[1]}-{parts[2]}.scope"]
        else:
            out.append(segment)
    return out


def _kube_segment(segment: str, kubepods: bool) -> tuple[str | None, str | None]:
    """(pod UID, container id) that one segment names."""
    if match := _POD_SLICE.match(segment):
        return _pod_uid(match.group(1)), None
    if kubepods and (match := _POD_DIR.match(segment)):
        return _pod_uid(match.group(1)), None
    if match := _CONTAINER_SCOPE.match(segment) or _CONTAINER_DIR.match(segment):
        return None, match.group(1)
    return None, None


def _pod_uid(raw: str) -> str:
    return raw.replace("_", "-").lower()


def workload_matches(workload: str, facts: CgroupFacts) -> bool:
    """Whether a lease's workload (``pod:``, ``container:``, ``unit:``, or ``pods:`` with
    pod UIDs joined by commas: the pods a shared claim is reserved for) is this cgroup."""
    kind, _, value = workload.partition(":")
    if not value:
        return False
    if kind == "pod":
        return facts.pod_uid == value.lower()
    if kind == "pods":
        return facts.pod_uid is not None and facts.pod_uid in value.lower().split(",")
    if kind == "container":
        return (
            facts.container_id is not None
            and len(value) >= MIN_CONTAINER_PREFIX
            and facts.container_id.startswith(value.lower())
        )
    if kind == "unit":
        return facts.unit == value
    return False


_SPECIFICITY = {"container": 0, "unit": 1, "pod": 2, "pods": 3}


def matching_leases(facts: CgroupFacts, workloads: Mapping[str, str]) -> list[str]:
    """The leases whose workload this cgroup is, most specific first (a container before
    its pod), then by lease id."""
    matched = [lid for lid, w in workloads.items() if w and workload_matches(w, facts)]
    return sorted(matched, key=lambda lid: (_SPECIFICITY[workloads[lid].split(":")[0]], lid))


def attribute(identity: ProcessIdentity, workloads: Mapping[str, str]) -> Attribution:
    """The lease a process belongs to among the live ones (lease id -> workload, "" for a
    lease bound to no workload), and whether its hint lies.

    - the cgroup decides: a process belongs to a lease whose workload its cgroup matches;
      the hint picks among several such leases;
    - a hint naming a lease bound to no workload, or to the pods a shared claim was
      reserved for when last read (``pods:``: a pod may have joined since), attributes
      the process to it, by the hint only, when its cgroup matches no lease;
    - a hint naming a live lease the cgroup contradicts is a mismatch: the process belongs
      to the lease its cgroup matches, if any, else to none;
    - a hint naming no live lease is ignored.
    """
    hint = identity.hint or identity.cgroup.lease_id
    matched = matching_leases(identity.cgroup, workloads)
    if hint in matched:
        return Attribution(hint, by_cgroup=True)
    owner = matched[0] if matched else None
    if hint is None or hint not in workloads:
        return Attribution(owner, by_cgroup=owner is not None)
    if owner is None and (not workloads[hint] or workloads[hint].startswith("pods:")):
        return Attribution(hint)
    bound = workloads[hint] or "no workload"
    said = f"process {identity.pid} names lease {hint} ({bound}) in its environment, but its "
    said += f"cgroup says {identity.cgroup.describe()}"
    said += f": it belongs to {owner}" if owner else ": it belongs to no lease"
    return Attribution(owner, by_cgroup=owner is not None, mismatch=said)
