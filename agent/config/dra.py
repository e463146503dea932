"""The agent as a Kubernetes DRA driver (``gpushare.io``; see docs/kubernetes.md)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config.fields import setting


@dataclass(frozen=True, slots=True)
class DraSettings:
    enabled: bool = setting(
        False,
        "Be the node's DRA driver gpushare.io: publish its GPUs as a ResourceSlice with "
        "consumable capacity, prepare the claims the default scheduler allocates to them "
        "(a lease per share, its MPS limits in a CDI spec), and have the last word on each "
        "share through a binding condition. Needs runtime.node_name to be the node's name.",
    )
    plugin_dir: str = setting(
        "/var/lib/kubelet/plugins/gpushare.io",
        "The driver's own kubelet plugin directory (its dra.sock).",
    )
    registry_dir: str = setting(
        "/var/lib/kubelet/plugins_registry",
        "The kubelet's plugin registry directory (the driver's registration socket).",
    )
    cdi_dir: str = setting(
        "/var/run/cdi", "Where the claims' CDI specs are written for the container runtime."
    )
    host_dev_root: str = setting(
        "/dev",
        "Where the agent reads the host's device nodes (/dev/nvidia<minor>, nvidiactl, "
        "nvidia-uvm, nvidia-caps/...) at each Prepare: in a pod, a hostPath mount of the "
        "host's /dev (e.g. /host/dev), not the container's own /dev, a copy taken at its "
        "start. The CDI specs name the host's /dev paths.",
    )
    host_root: str = setting(
        "/",
        "Where the agent sees the host's root filesystem (a read-only hostPath mount of /, "
        "e.g. /host); other than /: nvidia-ctk looks for the driver under it and its paths "
        "are written without this prefix.",
    )
    nvidia_ctk: str = setting(
        "nvidia-ctk",
        "The NVIDIA container toolkit's nvidia-ctk (a path or a name on PATH). Where found, "
        "the agent runs 'nvidia-ctk cdi generate' once at start and every claim's CDI spec "
        "carries the driver's libraries and hooks; empty or not found: GPU workload pods "
        "need the NVIDIA runtime (runtimeClassName: nvidia).",
    )
    nvidia_ctk_timeout_s: float = setting(
        60.0, "How long 'nvidia-ctk cdi generate' may take at start.", min=1.0
    )
    shm_dir: str = setting(
        "",
        "A host directory mounted at /dev/shm in each client container, shared with the MPS "
        "server (the mps-host pod mounts the same one). Empty: none.",
    )
    api_server: str = setting(
        "", "The Kubernetes API server URL. Empty: the pod's in-cluster service account."
    )
    api_token_file: str = setting("", "Bearer token file for dra.api_server.")
    api_ca: str = setting("", "CA certificate of dra.api_server.")
    api_timeout_s: float = setting(10.0, "How long one Kubernetes API request may take.", min=0.1)
    binding_conditions: bool = setting(
        True,
        "Publish the binding condition gpushare.io/admitted on each device, so that the "
        "scheduler waits, before it binds a pod, for the agent's rules to admit its claim's "
        "shares (asked by the cluster's elected controller, 'gpushare dra controller', "
        "through the AnswerClaim RPC; needs DRADeviceBindingConditions, beta in 1.36). "
        "Off: the rules run at Prepare only.",
    )
    clients_per_device: int = setting(
        16,
        "Shares one device takes at most (its 'clients' capacity); the memory capacity "
        "leaves a CUDA context overhead for each of them.",
        min=1,
    )
    default_memory: str = setting(
        "8GiB", "Memory a claim that does not ask for any consumes (the default share)."
    )
    default_thread_pct: int = setting(
        25, "Thread percentage a claim that does not ask for any consumes.", min=1
    )
    slice_min_interval_s: float = setting(
        1.0, "Least time between two writes of the node's ResourceSlice.", min=0.05
    )
    require_run_as_user: bool = setting(
        True,
        "Refuse a share on an MPS device whose pod does not say which user its containers "
        "run as (securityContext.runAsUser of the container or the pod): one MPS server "
        "serves one user at a time, so the agent must know the share's user to keep shares "
        "of two users off one device. Not applied where mps.multi_user is on. false: such "
        "a share carries no user and is not checked (its processes wait in CUDA "
        "initialisation while another user's run on the device).",
    )
    memory_policy: str = setting(
        "report",
        "A claim's share whose processes together use more device memory than the share "
        "(MPS limits each process, not their sum): 'enforce' (its MPS clients are "
        "terminated, only those of the pods the claim is reserved for, known by their "
        "cgroup) or 'report' (a violation event and metric). janitor.memory_policy is the "
        "same for leases admitted over gRPC.",
        choices=("report", "enforce"),
    )
    refusal_backoff_s: float = setting(
        10.0,
        "Seconds a device stays tainted gpushare.io/refused (NoSchedule) after the agent "
        "refused a share on it at its binding, so that the scheduler tries another device "
        "first. 0: no taint.",
        min=0.0,
    )
    reconcile_interval_s: float = setting(
        30.0,
        "Seconds between two passes that release the leases of claims gone or no longer "
        "allocated here.",
        min=0.1,
    )
