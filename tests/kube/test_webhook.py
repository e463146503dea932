"""The admission webhook over real HTTP on loopback (and HTTPS with real certificates),
with AdmissionReview bodies as the API server sends them."""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import socket
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.core.errors import ConfigError
from agent.core.podusers import FIX
from agent.legacy.cluster.annotations import FINALIZER, SCHEDULER_NAME
from agent.legacy.cluster.webhook import MAX_REVIEW_BYTES, build_webhook_app, serve_webhook
from tests.certs import make_pki

NS = "team-a"
Pod = dict[str, Any]


def container(name: str = "train", *, share: bool = True, **extra: Any) -> dict[str, Any]:
    """A container as the API server has defaulted it before admission."""
    limits = {"gpushare.io/share": "1"} if share else {"cpu": "1"}
    return {
        "name": name,
        "image": "registry.example/train:1",
        "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": limits, "requests": dict(limits)},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {
                "name": "kube-api-access-abcde",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            }
        ],
        **extra,
    }


def gpu_pod(**annotations: str) -> Pod:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "train-42-0",
            "namespace": NS,
            "creationTimestamp": None,
            "labels": {"app": "train"},
            "annotations": {
                "gpushare.io/memory": "20Gi",
                "gpushare.io/threads": "25",
                "gpushare.io/priority": "burstable",
                **annotations,
            },
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-abcde", "projected": {"sources": []}}],
            "containers": [container()],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {"runAsUser": 1000},  # the share's user
            "schedulerName": "default-scheduler",
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }


def plain_pod() -> Pod:
    pod = gpu_pod()
    pod["metadata"]["annotations"] = {}
    pod["spec"]["containers"] = [container(share=False)]
    return pod


def review(
    pod: Pod | None, *, operation: str = "CREATE", old: Pod | None = None, **extra: Any
) -> dict[str, Any]:
    named = pod or old or {}
    request = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": named.get("metadata", {}).get("name", ""),
        "namespace": NS,
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "object": pod,
        "oldObject": old,
        "dryRun": False,
        "options": {"kind": f"{operation.title()}Options", "apiVersion": "meta.k8s.io/v1"},
        **extra,
    }
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def apply_patch(document: Pod, patch: list[dict[str, Any]]) -> Pod:
    """RFC 6902 ``add``, the only operation the webhook sends: the parent must exist, an
    object member is set, ``-`` appends to an array."""
    result = copy.deepcopy(document)
    for operation in patch:
        assert operation["op"] == "add", operation
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]
        ]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), operation["value"])
        else:
            target[last] = operation["value"]
    return result


@dataclass
class Webhook:
    session: aiohttp.ClientSession
    url: str

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        data = io.BytesIO(body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"Content-Type": "application/json"}
        async with self.session.post(self.url + path, data=data, headers=headers) as answer:
            text = await answer.text()
            is_json = answer.content_type == "application/json"
            return answer.status, json.loads(text) if is_json else text

    async def admit(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, answer = await self.post(path, body)
        assert status == 200, answer
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        response: dict[str, Any] = answer["response"]
        assert response["uid"] == body["request"]["uid"]
        return response


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    runner = web.AppRunner(build_webhook_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            yield Webhook(session, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


# -- mutation ----------------------------------------------------------------------------


async def test_a_valid_pod_gets_the_scheduler_and_the_finalizer(webhook: Webhook) -> None:
    pod = gpu_pod()
    mutated = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    assert mutated["spec"]["schedulerName"] == SCHEDULER_NAME
    assert mutated["metadata"]["finalizers"] == [FINALIZER]
    mutated["spec"]["schedulerName"] = pod["spec"]["schedulerName"]
    del mutated["metadata"]["finalizers"]
    assert mutated == pod  # nothing else changed


async def test_a_pod_without_a_scheduler_name_gets_ours(webhook: Webhook) -> None:
    pod = gpu_pod()
    del pod["spec"]["schedulerName"]
    mutated = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    assert mutated["spec"]["schedulerName"] == SCHEDULER_NAME


async def test_an_existing_finalizer_list_is_appended_to(webhook: Webhook) -> None:
    pod = gpu_pod()
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    mutated = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    assert mutated["metadata"]["finalizers"] == ["example.com/keep", FINALIZER]


async def test_a_second_mutation_adds_nothing(webhook: Webhook) -> None:
    pod = gpu_pod()
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    once = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    again = await webhook.admit("/mutate", review(once))
    assert again["allowed"] is True
    assert "patch" not in again and "patchType" not in again
    assert once["metadata"]["finalizers"].count(FINALIZER) == 1


async def test_a_pod_in_the_requests_namespace_only_is_read_with_it(webhook: Webhook) -> None:
    pod = gpu_pod(**{"gpushare.io/gang": "g" * 121, "gpushare.io/gang-size": "2"})
    del pod["metadata"]["namespace"]  # the request's namespace, team-a, is the pod's
    assert (await webhook.admit("/mutate", review(pod)))["allowed"] is True
    pod["metadata"]["annotations"]["gpushare.io/gang"] = "g" * 122  # team-a/ + 122 > 128
    refused = await webhook.admit("/mutate", review(pod))
    assert refused["status"]["message"].startswith("gpushare.io/gang: is too long")


async def test_validate_allows_a_valid_pod_without_a_patch(webhook: Webhook) -> None:
    response = await webhook.admit("/validate", review(gpu_pod()))
    assert response["allowed"] is True
    assert "patch" not in response


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    "make",
    [
        plain_pod,
        lambda: {**plain_pod(), "spec": {**plain_pod()["spec"], "schedulerName": "other"}},
        lambda: {
            **plain_pod(),
            "spec": {
                **plain_pod()["spec"],
                "containers": [
                    container(
                        share=False,
                        securityContext={"privileged": True},
                        env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/x"}],
                        envFrom=[{"configMapRef": {"name": "gpu-all"}}],
                        resources={"limits": {"nvidia.com/gpu": "1"}},
                    )
                ],
                "volumes": [{"name": "h", "hostPath": {"path": "/run/gpushare"}}],
            },
        },
    ],
    ids=["plain", "other scheduler", "privileged whole-GPU pod"],
)
async def test_pods_without_a_share_are_untouched(
    webhook: Webhook, path: str, make: Callable[[], Pod]
) -> None:
    response = await webhook.admit(path, review(make()))
    assert response == {"uid": response["uid"], "allowed": True}


# -- refusals ----------------------------------------------------------------------------


def changed(change: Callable[[Pod], object]) -> Pod:
    pod = gpu_pod()
    change(pod)
    return pod


def first(pod: Pod) -> dict[str, Any]:
    container_: dict[str, Any] = pod["spec"]["containers"][0]
    return container_


def annotate(**values: str) -> Callable[[Pod], object]:
    return lambda pod: pod["metadata"]["annotations"].update(values)


def env(*variables: dict[str, Any], kind: str = "containers") -> Callable[[Pod], object]:
    def change(pod: Pod) -> None:
        if kind == "initContainers":
            pod["spec"]["initContainers"] = [container("setup", share=False)]
        pod["spec"][kind][0]["env"] = [{"name": "HOME", "value": "/root"}, *variables]

    return change


def host_path(path: str) -> Callable[[Pod], object]:
    return lambda pod: pod["spec"]["volumes"].append({"name": "h", "hostPath": {"path": path}})


def security(context: dict[str, Any]) -> Callable[[Pod], object]:
    return lambda pod: first(pod).update(securityContext=context)


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


# -- the share's user --------------------------------------------------------------------

NOT_STATED = "the GPU share's user is not stated: " + FIX


def run_as(pod_uid: object = None, **container_uids: object) -> Callable[[Pod], object]:
    """The pod's runAsUser (None: unset) and its containers', by name (a container named
    here and not in the pod is added without a share, ``<name>-share`` with a share of 0)."""

    def change(pod: Pod) -> None:
        pod["spec"]["securityContext"] = {} if pod_uid is None else {"runAsUser": pod_uid}
        for name, uid in container_uids.items():
            found = [c for c in pod["spec"]["containers"] if c["name"] == name]
            if not found:
                share = {"gpushare.io/share": "0"} if name.endswith("-share") else {"cpu": "1"}
                found = [container(name, resources={"limits": share})]
                pod["spec"]["containers"].extend(found)
            if uid is not None:
                found[0]["securityContext"] = {"runAsUser": uid}

    return change


def share_init_container(uid: object = None) -> Callable[[Pod], object]:
    """The share asked by an init container (the main container asks none)."""

    def change(pod: Pod) -> None:
        pod["spec"]["securityContext"] = {}
        pod["spec"]["containers"] = [container(share=False, securityContext={"runAsUser": 1000})]
        pod["spec"]["initContainers"] = [
            container("setup", **({} if uid is None else {"securityContext": {"runAsUser": uid}}))
        ]

    return change


USER_REFUSED: list[tuple[str, Callable[[Pod], object], str]] = [
    ("no runAsUser", run_as(None),
     f"spec.containers[0].securityContext.runAsUser: {NOT_STATED}"),
    ("a runAsUser of -1", run_as(-1), "spec.containers[0].securityContext.runAsUser: the GPU"),
    ("a runAsUser over the range", run_as(2**32 - 1), "spec.containers[0].securityContext"),
    ("a runAsUser as a string", run_as("1000"), "spec.containers[0].securityContext"),
    ("a runAsUser of true", run_as(True), "spec.containers[0].securityContext"),
    ("a container's unreadable one hides the pod's", run_as(1000, train=-5),
     "spec.containers[0].securityContext.runAsUser: the GPU"),
    ("two UIDs in one share", run_as(1000, **{"aux-share": 2000}),
     "spec.containers[1].securityContext.runAsUser: is 2000, but spec.containers[0] runs as "
     "1000: a share has one user; " + FIX),
    ("a second share container without one", run_as(None, train=1000, **{"aux-share": None}),
     f"spec.containers[1].securityContext.runAsUser: {NOT_STATED}"),
    ("an init container's share without one", share_init_container(),
     f"spec.initContainers[0].securityContext.runAsUser: {NOT_STATED}"),
    ("an init container's share of another UID than the main share",
     lambda p: (share_init_container(1000)(p), p["spec"]["containers"].append(container(
         "main-share", resources={"limits": {"gpushare.io/share": "0"}},
         securityContext={"runAsUser": 2000}))),
     "spec.containers[1].securityContext.runAsUser: is 2000, but spec.initContainers[0] runs"),
]  # fmt: skip

USER_ALLOWED: list[tuple[str, Callable[[Pod], object]]] = [
    ("the pod's only", run_as(1000)),
    ("root", run_as(0)),
    ("the largest UID", run_as(2**32 - 2)),
    ("the container's only", run_as(None, train=1000)),
    ("the container overrides the pod's", run_as(1000, train=2000)),
    ("a sidecar without a share may run as another", run_as(1000, sidecar=2000)),
    ("a sidecar without a share need not say", run_as(None, train=1000, sidecar=None)),
    ("two share containers of one UID", run_as(None, train=1000, **{"aux-share": 1000})),
    ("an init container's share", share_init_container(1000)),
]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("change", "message"), [r[1:] for r in USER_REFUSED], ids=[r[0] for r in USER_REFUSED]
)
async def test_a_share_states_its_one_user(
    webhook: Webhook, path: str, change: Callable[[Pod], object], message: str
) -> None:
    response = await webhook.admit(path, review(changed(change)))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["message"].startswith(message), response["status"]["message"]


@pytest.mark.parametrize("change", [a[1] for a in USER_ALLOWED], ids=[a[0] for a in USER_ALLOWED])
async def test_the_share_user_near_misses(
    webhook: Webhook, change: Callable[[Pod], object]
) -> None:
    pod = changed(change)
    mutated = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    assert (await webhook.admit("/validate", review(mutated)))["allowed"] is True


async def test_an_annotation_only_pod_is_refused_for_its_missing_share(webhook: Webhook) -> None:
    """A pod that asks by annotation only: its share request is what it must fix first."""
    pod = changed(lambda p: p["spec"].update(containers=[container(share=False)]))
    pod["spec"]["securityContext"] = {}
    response = await webhook.admit("/validate", review(pod))
    assert response["status"]["message"].startswith("gpushare.io/share: no container requests")


@pytest.fixture
async def optional_user() -> AsyncIterator[Webhook]:
    """The webhook of ``kube serve --run-as-user optional``."""
    runner = web.AppRunner(build_webhook_app(require_user=False))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Webhook(session, f"http://127.0.0.1:{runner.addresses[0][1]}")
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("change", [r[1] for r in USER_REFUSED], ids=[r[0] for r in USER_REFUSED])
async def test_with_the_user_optional_those_pass(
    optional_user: Webhook, change: Callable[[Pod], object]
) -> None:
    pod = changed(change)
    mutated = apply_patch(pod, patch_of(await optional_user.admit("/mutate", review(pod))))
    assert (await optional_user.admit("/validate", review(mutated)))["allowed"] is True
    refused = await optional_user.admit(
        "/validate", review(changed(security({"privileged": True})))
    )
    assert refused["allowed"] is False  # the other rules hold


async def test_a_pod_from_before_the_rule_may_still_change_and_go(webhook: Webhook) -> None:
    """runAsUser cannot change on a pod: one admitted before the rule keeps its other ways
    (a pending pod's new ask, the finalizer dropped, a debug container)."""
    old = changed(run_as(None))
    old["metadata"].update(uid=str(uuid.uuid4()), finalizers=[FINALIZER], resourceVersion="7")
    good = update(old, annotate(**{"gpushare.io/threads": "50"}))
    assert (await webhook.admit("/validate", good))["allowed"] is True
    gone = update(old, lambda p: p["metadata"].update(finalizers=[]))
    assert (await webhook.admit("/validate", gone))["allowed"] is True
    assert (await webhook.admit("/validate", debugged(old, debug_container())))["allowed"]


# -- updates -----------------------------------------------------------------------------


def admitted(*, node: str = "") -> Pod:
    """A pod as stored after the webhook (and, with ``node``, after its bind)."""
    pod = gpu_pod()
    pod["metadata"].update(uid=str(uuid.uuid4()), finalizers=[FINALIZER], resourceVersion="7")
    pod["spec"]["schedulerName"] = SCHEDULER_NAME
    if node:
        pod["metadata"]["annotations"]["gpushare.io/lease"] = "l-1"
        pod["spec"]["nodeName"] = node
    return pod


def update(old: Pod, change: Callable[[Pod], object]) -> dict[str, Any]:
    new = copy.deepcopy(old)
    change(new)
    return review(new, operation="UPDATE", old=old)


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
async def test_a_bound_pod_keeps_its_ask(webhook: Webhook, path: str) -> None:
    old = admitted(node="gpu-node-1")
    for name, value in [("threads", "50"), ("memory", "40Gi"), ("priority", "guaranteed")]:
        response = await webhook.admit(
            path, update(old, annotate(**{f"gpushare.io/{name}": value}))
        )
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert response["status"]["message"].startswith(
            f"gpushare.io/{name}: cannot change on a pod bound to node 'gpu-node-1'"
        )
    removed = update(old, lambda p: p["metadata"]["annotations"].pop("gpushare.io/threads"))
    assert (await webhook.admit(path, removed))["status"]["message"].startswith(
        "gpushare.io/threads: cannot change"
    )
    added = update(old, annotate(**{"gpushare.io/gang": "late", "gpushare.io/gang-size": "2"}))
    assert (await webhook.admit(path, added))["allowed"] is False


async def test_a_bound_pod_keeps_its_lease(webhook: Webhook) -> None:
    old = admitted(node="gpu-node-1")
    response = await webhook.admit("/validate", update(old, annotate(**{
        "gpushare.io/lease": "lease-of-another"})))  # fmt: skip
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("gpushare.io/lease: cannot change")


async def test_a_pending_pod_may_change_its_ask_within_the_rules(webhook: Webhook) -> None:
    old = admitted()
    good = update(old, annotate(**{"gpushare.io/threads": "50"}))
    assert (await webhook.admit("/validate", good))["allowed"] is True
    bad = await webhook.admit("/validate", update(old, annotate(**{"gpushare.io/threads": "0"})))
    assert bad["allowed"] is False
    assert bad["status"]["code"] == 400
    assert bad["status"]["message"].startswith("gpushare.io/threads: must be a number")


async def test_the_binder_may_write_the_lease_before_binding(webhook: Webhook) -> None:
    old = admitted()
    response = await webhook.admit("/validate", update(old, annotate(**{
        "gpushare.io/lease": "l-1"})))  # fmt: skip
    assert response["allowed"] is True


async def test_updates_that_leave_the_ask_alone_pass(webhook: Webhook) -> None:
    """The controller must always be able to drop its finalizer, even from a pod admitted
    before a rule existed (here: privileged, and with an ask that no longer parses)."""
    old = admitted(node="gpu-node-1")
    old["metadata"]["annotations"]["gpushare.io/threads"] = "0"
    first(old)["securityContext"] = {"privileged": True}
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    def drop_finalizer(pod: Pod) -> None:
        pod["metadata"]["finalizers"] = []
        pod["metadata"]["labels"]["seen"] = "yes"

    for path in ("/validate", "/mutate"):
        response = await webhook.admit(path, update(old, drop_finalizer))
        assert response == {"uid": response["uid"], "allowed": True}


async def test_status_updates_and_deletes_pass(webhook: Webhook) -> None:
    old = admitted(node="gpu-node-1")
    status = update(old, annotate(**{"gpushare.io/threads": "99"}))
    status["request"]["subResource"] = "status"
    assert (await webhook.admit("/validate", status))["allowed"] is True
    deleting = review(None, operation="DELETE", old=old)
    assert (await webhook.admit("/validate", deleting))["allowed"] is True


# -- ephemeral containers (kubectl debug) ------------------------------------------------


def debug_container(name: str = "debugger", **extra: Any) -> dict[str, Any]:
    """An ephemeral container as ``kubectl debug`` adds it (no resources, no ports)."""
    return {
        "name": name,
        "image": "busybox:1.36",
        "imagePullPolicy": "IfNotPresent",
        "stdin": True,
        "tty": True,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "targetContainerName": "train",
        **extra,
    }


def debugged(old: Pod, *added: dict[str, Any]) -> dict[str, Any]:
    """The review of the ``pods/ephemeralcontainers`` subresource: an UPDATE whose object is
    the pod with its new ephemeral containers."""
    new = copy.deepcopy(old)
    new["spec"].setdefault("ephemeralContainers", []).extend(added)
    body = review(new, operation="UPDATE", old=old)
    body["request"].update(subResource="ephemeralcontainers")
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "pods"}
    return body


EPHEMERAL_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("privileged", debug_container(securityContext={"privileged": True}),
     "spec.ephemeralContainers[0].securityContext.privileged: "),
    ("SYS_PTRACE", debug_container(securityContext={"capabilities": {"add": ["SYS_PTRACE"]}}),
     "spec.ephemeralContainers[0].securityContext.capabilities.add[0]: "),
    ("CUDA_MPS_", debug_container(env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp"}]),
     "spec.ephemeralContainers[0].env[0].name: 'CUDA_MPS_PIPE_DIRECTORY'"),
    ("NVIDIA_VISIBLE_DEVICES", debug_container(env=[{"name": "NVIDIA_VISIBLE_DEVICES",
                                                     "value": "all"}]),
     "spec.ephemeralContainers[0].env[0].name: 'NVIDIA_VISIBLE_DEVICES'"),
    ("envFrom prefix", debug_container(envFrom=[{"prefix": "GPUSHARE_",
                                                 "configMapRef": {"name": "c"}}]),
     "spec.ephemeralContainers[0].envFrom[0].prefix: "),
    ("envFrom without a prefix", debug_container(envFrom=[{"configMapRef": {"name": "gpu-all"}}]),
     "spec.ephemeralContainers[0].envFrom[0].prefix: a pod with a GPU share may not load"),
]  # fmt: skip


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
@pytest.mark.parametrize(
    ("added", "message"), [e[1:] for e in EPHEMERAL_REFUSED], ids=[e[0] for e in EPHEMERAL_REFUSED]
)
async def test_ephemeral_containers_of_a_share_pod_keep_the_rules(
    webhook: Webhook, path: str, added: dict[str, Any], message: str
) -> None:
    for old in (admitted(), admitted(node="gpu-node-1")):
        response = await webhook.admit(path, debugged(old, added))
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert response["status"]["message"].startswith(message), response["status"]["message"]
        assert "patch" not in response


async def test_a_plain_debug_container_may_be_added(webhook: Webhook) -> None:
    old = admitted(node="gpu-node-1")
    assert (await webhook.admit("/validate", debugged(old, debug_container())))["allowed"]
    # one added before the rule existed does not block the next: only the new one is judged
    old["spec"]["ephemeralContainers"] = [
        debug_container("old", securityContext={"privileged": True})
    ]
    again = debugged(old, debug_container("debugger-2"))
    assert (await webhook.admit("/validate", again))["allowed"] is True
    refused = debugged(old, debug_container("debugger-3", securityContext={"privileged": True}))
    response = await webhook.admit("/validate", refused)
    assert response["status"]["message"].startswith("spec.ephemeralContainers[1].securityContext")


async def test_debug_containers_of_other_pods_are_not_ours(webhook: Webhook) -> None:
    old = plain_pod()
    privileged = debug_container(securityContext={"privileged": True})
    assert (await webhook.admit("/validate", debugged(old, privileged)))["allowed"] is True


# -- which reviews are of a pod ----------------------------------------------------------


async def test_a_pod_is_checked_whatever_the_kind_says(webhook: Webhook) -> None:
    """The API server sends request.kind and request.resource; a review that says pods in
    either (or carries a Pod) is judged as a pod's."""
    pod = changed(security({"privileged": True}))
    for kind in ({"group": "apps", "version": "v1", "kind": "Deployment"}, {"kind": 7}):
        body = review(pod)
        body["request"]["kind"] = kind
        for path in ("/validate", "/mutate"):
            response = await webhook.admit(path, body)
            assert response["allowed"] is False, (kind, response)
            assert response["status"]["code"] == 403
    body = review(pod)
    body["request"]["kind"] = {"group": "", "version": "v1", "kind": "Node"}
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "nodes"}
    body["request"]["object"] = {**pod, "kind": "Pod"}
    assert (await webhook.admit("/validate", body))["allowed"] is False


async def test_a_review_of_something_else_is_allowed(webhook: Webhook) -> None:
    body = review({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "c"}})
    body["request"]["kind"] = {"group": "", "version": "v1", "kind": "ConfigMap"}
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "configmaps"}
    assert (await webhook.admit("/validate", body))["allowed"] is True


# -- what reaches the log ----------------------------------------------------------------


async def test_a_refusal_is_one_escaped_log_line(
    webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    pod = changed(security({"privileged": True}))
    pod["metadata"]["name"] = (
        "train\nINFO agent.legacy.cluster.webhook: allowed CREATE of pod team-a/x"
    )
    pod["metadata"]["namespace"] = "team-a\r\x1b[2K"
    with caplog.at_level("INFO", logger="agent.legacy.cluster.webhook"):
        response = await webhook.admit("/validate", review(pod))
    assert response["allowed"] is False
    [record] = [r for r in caplog.records if r.name == "agent.legacy.cluster.webhook"]
    line = record.getMessage()
    assert line.isprintable(), line
    assert "train\\nINFO" in line  # escaped, still readable
    assert record.exc_info is None


async def test_long_values_are_not_echoed(webhook: Webhook) -> None:
    pod = changed(annotate(**{"gpushare.io/memory": "1e999"}))
    response = await webhook.admit("/validate", review(pod))
    message = response["status"]["message"]
    assert message.startswith("gpushare.io/memory: ")
    assert len(message) < 200 and "0" * 41 not in message, message


# -- malformed reviews, health -----------------------------------------------------------


def without(key: str) -> dict[str, Any]:
    body = review(gpu_pod())
    del body["request"][key]
    return body


MALFORMED: list[tuple[str, Any, str]] = [
    ("not JSON", b"{not json", "not an AdmissionReview"),
    ("a list", [], "must be a JSON object"),
    ("old API", {**review(gpu_pod()), "apiVersion": "admission.k8s.io/v1beta1"},
     "expected apiVersion admission.k8s.io/v1"),
    ("another kind", {**review(gpu_pod()), "kind": "Pod"}, "kind AdmissionReview"),
    ("no request", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
     "request is missing"),
    ("no uid", without("uid"), "request.uid is missing"),
    ("no operation", without("operation"), "request.operation"),
    ("create without object", review(None), "request.object must be an object for CREATE"),
    ("update without old", review(gpu_pod(), operation="UPDATE"), "request.oldObject"),
    ("a string", "AdmissionReview", "must be a JSON object"),
    ("a number", 1e308, "must be a JSON object"),
    ("nested 50,000 deep", b"[" * 50_000 + b"]" * 50_000, "nested deeper than 64"),
    ("objects nested 50,000 deep", b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
     "nested deeper than 64"),
    ("nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000, "more than 100000 values"),
    ("a pod nested deep", json.dumps(review(gpu_pod())).replace(
        '"status": {}', '"status": ' + "[" * 70 + "]" * 70).encode(), "nested deeper than 64"),
    ("open brackets only", b"[" * 90_000, "nested deeper than 64"),
    ("a million open brackets", b"[" * 1_000_000, "has more than 100000 values"),
    ("half a review", json.dumps(review(gpu_pod())).encode()[:-10], "not JSON"),
    ("not UTF-8", b'{"kind": "\xff"}', "not UTF-8"),
    ("UTF-16", json.dumps(review(gpu_pod())).encode("utf-16"), "not UTF-8"),
    ("too many values", b"[" + b"0," * 300_000 + b"0]", "more than"),
    ("a huge integer", b"[" + b"9" * 5000 + b"]", "has a number of more than 100 digits"),
    ("an integer of 4,300 digits in a pod", json.dumps(review(gpu_pod())).replace(
        '"status": {}', '"status": ' + "9" * 4300).encode(), "more than 100 digits"),
    ("no kind", without("kind"), "request.kind is missing"),
    ("a kind without kind", {**review(gpu_pod()), "request": {
        **review(gpu_pod())["request"], "kind": {"group": "", "version": "v1"}}},
     "request.kind is missing"),
    ("a uid of a megabyte", {**review(gpu_pod()), "request": {
        **review(gpu_pod())["request"], "uid": "u" * 2**20}}, "request.uid"),
    ("a sub-resource that is not a string", {**review(gpu_pod()), "request": {
        **review(gpu_pod())["request"], "subResource": {"name": "status"}}},
     "request.subResource"),
]  # fmt: skip


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("body", "reason"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
async def test_malformed_reviews_are_400(
    webhook: Webhook, path: str, body: Any, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("DEBUG"):
        status, text = await webhook.post(path, body)
    assert status == 400
    assert reason in text, text
    assert len(text) < 1000, text  # says what is wrong, never repeats the body
    assert not [r for r in caplog.records if r.exc_info], "an expected error is no traceback"
    assert all(r.getMessage().isprintable() for r in caplog.records)


async def test_a_body_over_the_limit_is_413(webhook: Webhook) -> None:
    status, _ = await webhook.post("/validate", b" " * (MAX_REVIEW_BYTES + 1))
    assert status == 413


async def test_health_and_methods(webhook: Webhook) -> None:
    async with webhook.session.get(webhook.url + "/healthz") as answer:
        assert answer.status == 200
        assert await answer.text() == "ok"
    async with webhook.session.get(webhook.url + "/mutate") as answer:
        assert answer.status == 405


# -- HTTPS -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_serve_webhook_over_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    port = free_port()
    serving = asyncio.create_task(
        serve_webhook("127.0.0.1", port, str(pki.server_cert), str(pki.server_key)),
        name="webhook",
    )
    trust = ssl.create_default_context(cafile=str(pki.ca))
    url = f"https://localhost:{port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust)) as session:
            for _ in range(100):
                try:
                    async with session.get(url + "/healthz") as answer:
                        assert await answer.text() == "ok"
                        break
                except aiohttp.ClientConnectorError:
                    assert not serving.done(), serving
                    await asyncio.sleep(0.05)
            client = Webhook(session, url)
            pod = gpu_pod()
            mutated = apply_patch(pod, patch_of(await client.admit("/mutate", review(pod))))
            assert mutated["spec"]["schedulerName"] == SCHEDULER_NAME
        async with aiohttp.ClientSession() as plain:  # no trust in the test CA: refused
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await plain.get(url + "/healthz")
    finally:
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving


async def test_serve_webhook_without_its_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load"):
        await serve_webhook("127.0.0.1", 0, str(tmp_path / "no.crt"), str(tmp_path / "no.key"))
