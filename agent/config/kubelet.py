"""The agent as a kubelet device plugin for ``gpushare.io/share`` (see docs/kubernetes.md)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config.fields import setting


@dataclass(frozen=True, slots=True)
class KubeletSettings:
    enabled: bool = setting(
        False,
        "Serve the kubelet device-plugin API for gpushare.io/share: Allocate answers with "
        "the lease of the pod bound here by the gpushare scheduler.",
    )
    plugin_dir: str = setting(
        "/var/lib/kubelet/device-plugins",
        "The kubelet's device-plugin directory (its kubelet.sock; the agent's gpushare.sock).",
    )
    pod_resources_socket: str = setting(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "The kubelet's PodResources socket, to check each allocation went to its pod.",
    )
    slots: int = setting(
        64, "How many gpushare.io/share units the node advertises (pods at once).", min=1
    )
    hold_s: float = setting(
        30.0,
        "How long a lease bound to this node waits for its kubelet Allocate; an older one is "
        "skipped (the scheduler extender waits as long between two binds on a node).",
        min=1.0,
    )
    cdi: bool = setting(
        False,
        "Also name the device for CDI (nvidia.com/gpu=<UUID>) in Allocate, for runtimes that "
        "support it.",
    )
    shm_dir: str = setting(
        "",
        "A host directory mounted at /dev/shm in each client container, shared with the MPS "
        "server (the mps-host pod mounts the same one). Empty: none.",
    )
    nri_socket: str = setting(
        "",
        "The container runtime's NRI socket (containerd 2 and CRI-O: /var/run/nri/nri.sock). "
        "Set: the agent also registers there as the NRI plugin 10-gpushare and gives each "
        "container its pod's lease at CreateContainer (the runtime names the pod), so binds "
        "to this node need not wait for one another. Empty: the device plugin alone.",
    )
