"""The admission webhook's refusals of a pod with a GPU share, each naming the field at
fault, and the near misses it allows."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.legacy.cluster.annotations import FINALIZER
from tests.kube.webhook_reviews import (
    Pod,
    Webhook,
    annotate,
    apply_patch,
    changed,
    container,
    env,
    first,
    host_path,
    patch_of,
    plain_pod,
    review,
    security,
)

REFUSED: list[tuple[str, Callable[[Pod], object], int, str]] = [
    ("bad threads", annotate(**{"gpushare.io/threads": "250"}), 400,
     "gpushare.io/threads: must be a number in (0, 100]"),
    ("no memory", lambda p: p["metadata"]["annotations"].pop("gpushare.io/memory"), 400,
     "gpushare.io/memory: is required"),
    ("bad priority", annotate(**{"gpushare.io/priority": "urgent"}), 400,
     "gpushare.io/priority: must be guaranteed, burstable or best-effort"),
    ("gang alone", annotate(**{"gpushare.io/gang": "job-42"}), 400, "gpushare.io/gang: "),
    ("two shares", lambda p: p["spec"]["containers"].append(container("second")), 400,
     "gpushare.io/share: the pod requests 2 in all"),
    ("annotations but no share", lambda p: p["spec"].update(containers=[container(
        share=False)]), 400, "gpushare.io/share: no container requests it"),
    ("another scheduler", lambda p: p["spec"].update(schedulerName="volcano"), 400,
     "spec.schedulerName: a pod with a GPU share is scheduled by gpushare, not 'volcano'"),
    ("node name set", lambda p: p["spec"].update(nodeName="gpu-node-1"), 403, "spec.nodeName: "),
    ("privileged", security({"privileged": True}), 403,
     "spec.containers[0].securityContext.privileged: "),
    ("SYS_ADMIN", security({"capabilities": {"add": ["CHOWN", "SYS_ADMIN"]}}), 403,
     "spec.containers[0].securityContext.capabilities.add[1]: "),
    ("CAP_SYS_ADMIN", security({"capabilities": {"add": ["cap_sys_admin"]}}), 403,
     "spec.containers[0].securityContext.capabilities.add[0]: "),
    ("ALL", security({"capabilities": {"add": ["ALL"]}}), 403,
     "spec.containers[0].securityContext.capabilities.add[0]: a pod with a GPU share may not "
     "add 'ALL'"),
    ("privileged init container", lambda p: p["spec"].update(initContainers=[container(
        "setup", share=False, securityContext={"privileged": True})]), 403,
     "spec.initContainers[0].securityContext.privileged: "),
    ("privileged sidecar", lambda p: p["spec"]["containers"].append(container(
        "sidecar", share=False, securityContext={"privileged": True})), 403,
     "spec.containers[1].securityContext.privileged: "),
    ("CUDA_MPS_ value", env({"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/mps"}), 403,
     "spec.containers[0].env[1].name: 'CUDA_MPS_PIPE_DIRECTORY'"),
    ("GPUSHARE_ valueFrom", env({"name": "GPUSHARE_LEASE_ID", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}}}), 403,
     "spec.containers[0].env[1].name: 'GPUSHARE_LEASE_ID'"),
    ("init container env", env({"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
                               kind="initContainers"), 403, "spec.initContainers[0].env[1].name"),
    ("envFrom prefix", lambda p: first(p).update(envFrom=[{"prefix": "CUDA_MPS_",
                                                           "configMapRef": {"name": "c"}}]),
     403, "spec.containers[0].envFrom[0].prefix: "),
    ("agent runtime dir", host_path("/run/gpushare"), 403, "spec.volumes[1].hostPath.path: "),
    ("inside the runtime dir", host_path("/run/gpushare/pipes/GPU-0"), 403, "spec.volumes[1]"),
    ("the runtime dir via /var/run", host_path("/var/run/gpushare"), 403, "spec.volumes[1]"),
    ("agent state dir", host_path("/var/lib/gpushare/"), 403, "spec.volumes[1]"),
    ("device plugins", host_path("/var/lib/kubelet/device-plugins"), 403, "spec.volumes[1]"),
    ("a directory above", host_path("/var/lib"), 403, "spec.volumes[1]"),
    ("the root", host_path("/"), 403, "spec.volumes[1]"),
    ("dot-dot", host_path("/tmp/../run/./gpushare"), 403, "spec.volumes[1]"),
    ("lease annotation at creation", annotate(**{"gpushare.io/lease": "lease-of-another"}), 403,
     "gpushare.io/lease: is written by the gpushare scheduler"),
    ("node-agent annotation at creation", annotate(**{"gpushare.io/node-agent": "x:1"}), 403,
     "gpushare.io/node-agent: "),
    # the node's namespaces: /dev/shm (MPS's shared memory) is the IPC namespace's
    ("hostIPC", lambda p: p["spec"].update(hostIPC=True), 403,
     "spec.hostIPC: a pod with a GPU share may not share the node's IPC namespace"),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), 403,
     "spec.hostPID: a pod with a GPU share may not share the node's process namespace"),
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), 403,
     "spec.hostNetwork: a pod with a GPU share may not share the node's network namespace"),
    # capabilities beyond Pod Security baseline
    ("SYS_PTRACE", security({"capabilities": {"add": ["CHOWN", "SYS_PTRACE"]}}), 403,
     "spec.containers[0].securityContext.capabilities.add[1]: a pod with a GPU share may not "
     "add 'SYS_PTRACE'"),
    ("NET_ADMIN", security({"capabilities": {"add": ["NET_ADMIN"]}}), 403,
     "spec.containers[0].securityContext.capabilities.add[0]: "),
    ("NET_RAW", security({"capabilities": {"add": ["NET_RAW"]}}), 403,
     "spec.containers[0].securityContext.capabilities.add[0]: "),
    ("cap_sys_ptrace", security({"capabilities": {"add": ["cap_sys_ptrace"]}}), 403,
     "spec.containers[0].securityContext.capabilities.add[0]: "),
    ("a capability that is not a name", security({"capabilities": {"add": [["SYS_ADMIN"]]}}),
     403, "spec.containers[0].securityContext.capabilities.add[0]: "),
    ("init container SYS_PTRACE", lambda p: p["spec"].update(initContainers=[container(
        "setup", share=False, securityContext={"capabilities": {"add": ["SYS_PTRACE"]}})]), 403,
     "spec.initContainers[0].securityContext.capabilities.add[0]: "),
    # the devices a container sees are the lease's
    ("NVIDIA_VISIBLE_DEVICES", env({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}), 403,
     "spec.containers[0].env[1].name: 'NVIDIA_VISIBLE_DEVICES'"),
    ("CUDA_VISIBLE_DEVICES", env({"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}), 403,
     "spec.containers[0].env[1].name: 'CUDA_VISIBLE_DEVICES'"),
    ("NVIDIA_DRIVER_CAPABILITIES", env({"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}),
     403, "spec.containers[0].env[1].name: 'NVIDIA_DRIVER_CAPABILITIES'"),
    ("NVIDIA_ in an init container", env({"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"},
                                         kind="initContainers"), 403,
     "spec.initContainers[0].env[1].name"),
    ("lower-case nvidia_visible_devices", env({"name": "nvidia_visible_devices", "value": "all"}),
     403, "spec.containers[0].env[1].name"),
    ("envFrom NVIDIA_ prefix", lambda p: first(p).update(envFrom=[{"prefix": "NVIDIA_",
                                                                   "secretRef": {"name": "s"}}]),
     403, "spec.containers[0].envFrom[0].prefix: "),
    ("envFrom prefix reaching CUDA_VISIBLE_DEVICES", lambda p: first(p).update(envFrom=[
        {"prefix": "CUDA_VIS", "configMapRef": {"name": "c"}}]), 403,
     "spec.containers[0].envFrom[0].prefix: "),
    ("envFrom prefix N", lambda p: first(p).update(envFrom=[
        {"prefix": "APP_", "configMapRef": {"name": "c"}},
        {"prefix": "N", "configMapRef": {"name": "c"}}]), 403,
     "spec.containers[0].envFrom[1].prefix: "),
    # the keys of a ConfigMap or Secret are not in the review: without a prefix, any of
    # them (NVIDIA_VISIBLE_DEVICES=all, CUDA_MPS_*) would override the device plugin's
    ("envFrom a ConfigMap without a prefix", lambda p: first(p).update(envFrom=[
        {"configMapRef": {"name": "gpu-all"}}]), 403,
     "spec.containers[0].envFrom[0].prefix: a pod with a GPU share may not load a "
     "ConfigMap's or Secret's keys without a prefix"),
    ("envFrom a Secret without a prefix", lambda p: first(p).update(envFrom=[
        {"prefix": "APP_", "configMapRef": {"name": "c"}}, {"secretRef": {"name": "s"}}]), 403,
     "spec.containers[0].envFrom[1].prefix: "),
    ("envFrom an empty prefix", lambda p: first(p).update(envFrom=[
        {"prefix": "", "configMapRef": {"name": "gpu-all"}}]), 403,
     "spec.containers[0].envFrom[0].prefix: "),
    ("envFrom a prefix that is not a string", lambda p: first(p).update(envFrom=[
        {"prefix": None, "configMapRef": {"name": "gpu-all"}}]), 403,
     "spec.containers[0].envFrom[0].prefix: "),
    ("envFrom without a prefix in an init container", lambda p: p["spec"].update(
        initContainers=[container("setup", share=False, envFrom=[
            {"configMapRef": {"name": "gpu-all"}}])]), 403,
     "spec.initContainers[0].envFrom[0].prefix: "),
    ("envFrom without a prefix in a sidecar", lambda p: p["spec"]["containers"].append(
        container("sidecar", share=False, envFrom=[{"secretRef": {"name": "s"}}])), 403,
     "spec.containers[1].envFrom[0].prefix: "),
    # Kubernetes quantities are ASCII
    ("Arabic-Indic memory", annotate(**{"gpushare.io/memory": "\u0662\u0660Gi"}), 400,
     "gpushare.io/memory: cannot read"),
    ("full-width threads", annotate(**{"gpushare.io/threads": "\uff12\uff15"}), 400,
     "gpushare.io/threads: must be a number in (0, 100]"),
    ("sizing nested 500 deep", lambda p: p["metadata"].update(annotations={
        "gpushare.io/sizing": "[" * 500 + "]" * 500, "gpushare.io/threads": "50"}), 400,
     "gpushare.io/sizing: "),
    ("sizing with aliases", lambda p: p["metadata"].update(annotations={
        "gpushare.io/sizing": "{mode: &m training, parameters: 7e9, dtype: *m}",
        "gpushare.io/threads": "50"}), 400, "gpushare.io/sizing: "),
]  # fmt: skip


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("change", "code", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
async def test_refusals_name_the_field(
    webhook: Webhook, path: str, change: Callable[[Pod], object], code: int, message: str
) -> None:
    response = await webhook.admit(path, review(changed(change)))
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == code
    assert response["status"]["message"].startswith(message), response["status"]["message"]


async def test_a_forged_lease_is_refused_on_any_pod(webhook: Webhook) -> None:
    pod = plain_pod()
    pod["metadata"]["annotations"]["gpushare.io/lease"] = "lease-of-another"
    response = await webhook.admit("/validate", review(pod))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403


ALLOWED: list[tuple[str, Callable[[Pod], object]]] = [
    ("another host path", host_path("/var/lib/data")),
    ("a sibling of the runtime dir", host_path("/run/gpushare-other")),
    ("not privileged, baseline capabilities", security({"privileged": False, "capabilities": {
        "add": ["NET_BIND_SERVICE", "CHOWN", "cap_kill"], "drop": ["ALL"]}})),
    ("other CUDA variables", env({"name": "CUDA_CACHE_PATH", "value": "/tmp/cuda"},
                                 {"name": "MY_GPUSHARE_NOTE", "value": "x"},
                                 {"name": "MY_NVIDIA_NOTE", "value": "x"})),
    ("host namespaces false", lambda p: p["spec"].update(hostIPC=False, hostPID=False,
                                                         hostNetwork=False)),
    ("envFrom elsewhere", lambda p: first(p).update(envFrom=[{"prefix": "APP_",
                                                              "configMapRef": {"name": "c"}}])),
    ("our scheduler already", lambda p: p["spec"].update(schedulerName="gpushare")),
    ("a gang", annotate(**{"gpushare.io/gang": "job-42", "gpushare.io/gang-size": "4"})),
    ("sizing", lambda p: p["metadata"].update(annotations={
        "gpushare.io/sizing": '{"parameters": 1000000000, "mode": "training"}',
        "gpushare.io/threads": "50"})),
]  # fmt: skip


@pytest.mark.parametrize(("change"), [a[1] for a in ALLOWED], ids=[a[0] for a in ALLOWED])
async def test_allowed_near_misses(webhook: Webhook, change: Callable[[Pod], object]) -> None:
    pod = changed(change)
    mutated = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    assert mutated["metadata"]["finalizers"] == [FINALIZER]
    assert (await webhook.admit("/validate", review(mutated)))["allowed"] is True
