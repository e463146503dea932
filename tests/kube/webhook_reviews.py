"""The admission webhook's tests' common parts: pods and AdmissionReview bodies as the API
server sends them, the changes the tables make to a pod, a JSON patch applied as the API
server applies it, and a client of the webhook served over HTTP on loopback."""

from __future__ import annotations

import base64
import copy
import io
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from agent.legacy.cluster.annotations import FINALIZER, SCHEDULER_NAME

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


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


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


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[Webhook]:
    """``app`` over HTTP on a free loopback port, and a client session to it."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            yield Webhook(session, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
