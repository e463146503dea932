"""The checks of ``gpushare doctor``: each a pure function of gathered facts, answering one
:class:`Finding` -- ok, warn, fail or skip, what was found and, for what is wrong, the fix."""

from __future__ import annotations

from collections.abc import Sequence

from agent.doctor.facts import (
    AgentFacts,
    BinaryFacts,
    DriverFacts,
    Finding,
    KubeFacts,
    MpsDirFacts,
    PathFacts,
)
from agent.mps.version import mismatch

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
NODE_LABEL = "gpushare.io/node"  # the chart's node selector (the opt-in label)
# the labels the agent's DaemonSets select by: the chart's, and the plain manifests' (and
# the chart's before the opt-in label)
SELECTOR_LABELS = (NODE_LABEL, GPU_PRESENT_LABEL)
NVIDIA_GPU_RESOURCE = "nvidia.com/gpu"
MAX_LISTED = 3


def check_mps_binary(simulated: bool, binary: BinaryFacts) -> Finding:
    name = "mps-binary"
    if not binary.path:
        if binary.configured != "auto":
            return Finding(
                "fail",
                name,
                f"mps.control_binary {binary.configured} is not an executable",
                "point mps.control_binary at the driver's nvidia-cuda-mps-control, or set it "
                "to 'auto' (found on PATH)",
            )
        return Finding(
            "fail",
            name,
            "nvidia-cuda-mps-control is not on PATH",
            "install the driver's MPS utilities on the host (under Kubernetes the NVIDIA "
            "container toolkit mounts them: run the agent's pod under the nvidia "
            "RuntimeClass), or set mps.control_binary",
        )
    if not binary.executable:
        return Finding(
            "fail",
            name,
            f"{binary.path} is not executable by this user",
            f"chmod 0755 {binary.path}",
        )
    if binary.fake:
        if simulated:
            return Finding("ok", name, f"{binary.path} (the bundled fake: simulated node)")
        return Finding(
            "fail",
            name,
            f"{binary.path} is the simulation's fake MPS control on a real node",
            "set mps.control_binary to 'auto' or to the driver's nvidia-cuda-mps-control",
        )
    release = f"driver release {binary.release}" if binary.release else "no release embedded"
    return Finding("ok", name, f"{binary.path} ({release})")


def check_driver(driver: DriverFacts, binary: BinaryFacts) -> Finding:
    """The running driver (NVML) and the MPS control binary are of one release."""
    name = "driver-release"
    if driver.simulated:
        return Finding(
            "skip",
            name,
            "simulated node: no NVIDIA driver to ask (on a GPU node NVML's driver version is "
            "compared with the release nvidia-cuda-mps-control carries)",
        )
    if driver.version is None:
        return Finding(
            "fail",
            name,
            f"NVML cannot be asked: {driver.error or 'no driver'}",
            "install the NVIDIA driver on the host; in a pod, run it under the nvidia "
            "RuntimeClass so libnvidia-ml.so.1 and the device nodes are mounted",
        )
    if not binary.path or binary.fake:
        return Finding("warn", name, f"driver {driver.version}; no MPS control binary to compare")
    why = mismatch(binary.path, binary.release, driver.version)
    if why is not None:
        text, _, fix = why.partition(": ")
        return Finding("fail", name, text, fix)
    if binary.release is None:
        return Finding(
            "warn",
            name,
            f"driver {driver.version}; {binary.path} names no release, so it cannot be compared",
            "make sure it is the driver's own nvidia-cuda-mps-control (same package)",
        )
    return Finding("ok", name, f"driver {driver.version} = {binary.path}'s release")


def _no_api(name: str, kube: KubeFacts) -> Finding | None:
    if not kube.api:
        return Finding("skip", name, f"skipped: no API ({kube.why})")
    if kube.node is None:
        return Finding(
            "fail",
            name,
            f"node {kube.node_name} not read from {kube.api}: {kube.node_error}",
            _node_fix(kube),
        )
    return None


def _node_fix(kube: KubeFacts) -> str:
    if kube.node_status == 404:
        return "runtime.node_name (or --node) must be this node's Kubernetes name"
    if kube.node_status == 403 and kube.driver:
        can_i = f"; `kubectl auth can-i get nodes --as={kube.user}`" if kube.user else ""
        return (
            f"{kube.identity} must get nodes, as the DRA driver reads its Node: bind it the "
            "chart's ClusterRole gpushare-dra-driver (deploy/dra/rbac.yaml; its rule "
            f"apiGroups [''], resources [nodes], verbs [get]){can_i}"
        )
    if kube.node_status == 403:
        return (
            f"{kube.identity} may not get nodes: give --api-server and --api-token-file of "
            "an identity that may (the agent itself needs no API on the extender path)"
        )
    return _unread_fix(kube, kube.node_status)


def _unread_fix(kube: KubeFacts, status: int) -> str:
    """A read that failed for want of an answer or of a token the API server takes."""
    if status == 401:
        return f"{kube.api} does not accept {kube.identity} (401): give a valid token"
    return f"{kube.identity} must reach {kube.api}: check the address and the network"


def check_node_label(kube: KubeFacts) -> Finding:
    name = "node-label"
    unusable = _no_api(name, kube)
    if unusable is not None:
        return unusable
    assert kube.node is not None
    labels = (kube.node.get("metadata") or {}).get("labels") or {}
    for label in SELECTOR_LABELS:
        if labels.get(label) == "true":
            return Finding("ok", name, f"node {kube.node_name} has {label}=true")
    return Finding(
        "fail",
        name,
        f"node {kube.node_name} has neither {NODE_LABEL}=true (the chart's node selector) nor "
        f"{GPU_PRESENT_LABEL}=true (the plain manifests'): the agent's DaemonSets run on the "
        "nodes so labelled",
        f"`kubectl label node {kube.node_name} {NODE_LABEL}=true` (the chart's default "
        "nodeSelector), or give the chart another nodeSelector",
    )


def check_device_plugin(kube: KubeFacts) -> Finding:
    """NVIDIA's device plugin must not offer the GPUs the agent runs EXCLUSIVE_PROCESS."""
    name = "nvidia-device-plugin"
    unusable = _no_api(name, kube)
    if unusable is not None:
        return unusable
    assert kube.node is not None
    allocatable = (kube.node.get("status") or {}).get("allocatable") or {}
    count = str(allocatable.get(NVIDIA_GPU_RESOURCE, "0"))
    if count in ("", "0"):
        return Finding("ok", name, f"node {kube.node_name} offers no {NVIDIA_GPU_RESOURCE}")
    return Finding(
        "warn",
        name,
        f"node {kube.node_name} offers {count} {NVIDIA_GPU_RESOURCE}: pods given them run "
        "beside the agent's MPS on GPUs it sets to EXCLUSIVE_PROCESS",
        "disable NVIDIA's device plugin on this node (GPU Operator: label the node "
        "nvidia.com/gpu.deploy.device-plugin=false)",
    )


def check_runtime_class(kube: KubeFacts, *, workloads_need_it: bool = True) -> Finding:
    """The RuntimeClass exists. ``workloads_need_it``: GPU workload pods run under it (no
    CDI spec of the toolkit carries the driver to them); only a read that was refused
    (403) depends on it: a warning where they do, a skip where only the agent's own pod
    does (that pod runs, so its RuntimeClass exists)."""
    name = "runtime-class"
    if not kube.api:
        return Finding("skip", name, f"skipped: no API ({kube.why})")
    wanted = kube.runtime_class
    if kube.runtime_class_found is None:
        found = f"RuntimeClass {wanted} not read from {kube.api}: {kube.runtime_class_error}"
        if kube.runtime_class_status == 403:
            return _runtime_class_refused(kube, found, workloads_need_it)
        return Finding("fail", name, found, _unread_fix(kube, kube.runtime_class_status))
    if kube.runtime_class_found:
        return Finding("ok", name, f"RuntimeClass {wanted} exists")
    return Finding(
        "fail",
        name,
        f"no RuntimeClass {wanted}: the agent's and the workloads' pods run under it",
        "install the NVIDIA container toolkit with the GPU Operator (it creates it), or "
        f"create a RuntimeClass {wanted} with handler nvidia",
    )


def _runtime_class_refused(kube: KubeFacts, found: str, workloads_need_it: bool) -> Finding:
    """A RuntimeClass read refused: the DRA driver's role grants only the calls the agent
    makes, and the agent never reads RuntimeClasses."""
    name, wanted = "runtime-class", kube.runtime_class
    if not workloads_need_it:
        return Finding(
            "skip",
            name,
            f"{found}; not needed here: the claims' CDI specs carry the driver (nvidia-ctk), "
            "so GPU workload pods need no RuntimeClass",
        )
    return Finding(
        "warn",
        name,
        f"{found}; not checked ({kube.identity} may not get runtimeclasses, which the agent "
        "never reads), and GPU workload pods run under it",
        f"check it: `kubectl get runtimeclass {wanted}`; to have the doctor check it, grant "
        f"{kube.identity} get on runtimeclasses (apiGroups [node.k8s.io], resources "
        "[runtimeclasses], verbs [get]), or give --api-server and --api-token-file of an "
        "identity that may",
    )


def _pipe_mode(client_gid: int | None) -> int:
    return 0o750 if client_gid is not None else 0o700


def listed(items: Sequence[str]) -> str:
    shown = "; ".join(items[:MAX_LISTED])
    more = len(items) - MAX_LISTED
    return shown + (f" (+{more} more)" if more > 0 else "")


def check_mps_dirs(facts: MpsDirFacts) -> Finding:
    """The pipe and log directories as :class:`agent.mps.pipes.PipeWatch` makes them."""
    name = "mps-pipes"
    root = facts.root
    if root.error:
        return Finding("fail", name, f"cannot look at {root.path}: {root.error}", "")
    if not root.exists:
        if facts.agent_running:
            return Finding(
                "fail",
                name,
                f"{root.path} does not exist while the agent runs",
                "restart the agent (it makes the directory at start); check mps.root_dir",
            )
        return Finding(
            "warn", name, f"{root.path} does not exist yet (the agent makes it at start)"
        )
    if not facts.devices:
        return Finding("warn", name, f"no device directories under {root.path} yet")
    mode = _pipe_mode(facts.client_gid)
    group = "-" if facts.client_gid is None else str(facts.client_gid)
    owner = f"{facts.agent_uid}:{'' if facts.client_gid is None else facts.client_gid}"
    problems: list[str] = []
    fixes: list[str] = []
    for parent in (root, *(d.base for d in facts.devices)):
        if parent.exists and parent.mode & 0o022:
            problems.append(f"{parent.path} is writable by group or others ({parent.mode:04o})")
            fixes.append(f"chmod 0755 {parent.path}")
    for device in facts.devices:
        for directory in (device.pipe, device.log):
            if not directory.exists:
                problems.append(f"{directory.path} is missing")
                fixes.append(f"restart the agent (it makes {directory.path})")
                continue
            wrong_group = facts.client_gid is not None and directory.gid != facts.client_gid
            if directory.mode != mode or directory.uid != facts.agent_uid or wrong_group:
                problems.append(
                    f"{directory.path} is {directory.shown()}, must be {mode:04o} uid "
                    f"{facts.agent_uid} gid {group}"
                )
                fixes.append(f"chown {owner.rstrip(':')} {directory.path}")
                fixes.append(f"chmod {mode:04o} {directory.path}")
    if problems:
        fix = " && ".join(dict.fromkeys(fixes)) + (
            " (the agent puts them back at its next probe: a change means something else "
            "writes there)"
        )
        return Finding("fail", name, listed(problems), fix)
    summary = (
        f"{len(facts.devices)} device(s) under {root.path}: pipe and log {mode:04o} uid "
        f"{facts.agent_uid} gid {group}"
    )
    if facts.group_missing:
        return Finding(
            "warn",
            name,
            f"{summary}; mps.client_group {facts.group!r} does not exist, so only the agent's "
            "user reaches the MPS pipes",
            f"create the group {facts.group} with the gid the clients run as "
            "(runAsGroup/supplementalGroups), or set mps.client_gid",
        )
    return Finding("ok", name, summary)


def check_dir(name: str, key: str, enabled_key: str, enabled: bool, d: PathFacts) -> Finding:
    """A directory the agent writes into (plugin sockets, CDI specs): present, writable."""
    if not enabled:
        return Finding("skip", name, f"{enabled_key} is off")
    if d.error:
        return Finding("fail", name, f"cannot look at {d.path} ({key}): {d.error}")
    if not d.exists:
        return Finding(
            "fail",
            name,
            f"{d.path} ({key}) does not exist",
            f"mount the host's {d.path} into the agent's pod (hostPath), or set {key} to "
            "where the kubelet and the container runtime look",
        )
    if not d.is_dir:
        return Finding("fail", name, f"{d.path} ({key}) is not a directory", f"check {key}")
    if not d.writable:
        return Finding(
            "fail",
            name,
            f"{d.path} ({key}) is not writable by this user ({d.shown()})",
            "run the agent as root (the kubelet's directories are root's), or mount it read-write",
        )
    return Finding("ok", name, f"{d.path} exists and is writable")


def check_agent(facts: AgentFacts) -> Finding:
    name = "agent"
    if facts.error:
        return Finding(
            "fail",
            name,
            facts.error,
            "start the agent (gpushare serve; systemctl start gpushare-agent; under "
            "Kubernetes: kubectl -n gpushare-system get pods -o wide --field-selector "
            "spec.nodeName=<node>, then its logs)",
        )
    mode = "simulated node" if facts.simulated else "real node"
    return Finding(
        "ok",
        name,
        f"answers on {facts.where}: node {facts.node_name} ({mode}), {facts.devices} "
        f"device(s), agent {facts.version}",
    )
