"""The cluster side's manifests (deploy/) as the checks read them: their documents, the
scheduler's pod and configuration, ``gpushare kube serve``'s arguments there, a strict
``kubernetes-validate``, the API calls each port method of the agent makes (for the RBAC
rules), and the JSON patch of the kind bring-up applied."""

from __future__ import annotations

import ast
import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import REPO

DEPLOY = REPO / "deploy"
KIND = DEPLOY / "kind"
BIN = Path(sys.executable).parent
NAMESPACE = "gpushare-system"


# The kubernetes_asyncio calls of agent/legacy/cluster/rest.py -> (API group, resource, verb).
CALLS = {
    "read_namespaced_pod": ("", "pods", "get"),
    "list_pod_for_all_namespaces": ("", "pods", "list"),  # "watch" with watch=True
    "patch_namespaced_pod": ("", "pods", "patch"),
    "delete_namespaced_pod": ("", "pods", "delete"),
    "create_namespaced_pod_binding": ("", "pods/binding", "create"),
    "patch_node": ("", "nodes", "patch"),
    "patch_node_status": ("", "nodes/status", "patch"),
    "create_namespaced_event": ("", "events", "create"),
    "list_namespaced_endpoint_slice": ("discovery.k8s.io", "endpointslices", "list"),
    "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", "create"),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", "update"),
    # gpushare doctor's (run by hand, with the caller's own account)
    "read_runtime_class": ("node.k8s.io", "runtimeclasses", "get"),
    # the DRA driver's (deploy/dra/rbac.yaml; tests/deploy/test_dra_manifests.py)
    "read_node": ("", "nodes", "get"),
    "list_resource_slice": ("resource.k8s.io", "resourceslices", "list"),
    "create_resource_slice": ("resource.k8s.io", "resourceslices", "create"),
    "replace_resource_slice": ("resource.k8s.io", "resourceslices", "update"),
    "delete_resource_slice": ("resource.k8s.io", "resourceslices", "delete"),
    "read_namespaced_resource_claim": ("resource.k8s.io", "resourceclaims", "get"),
    "list_resource_claim_for_all_namespaces": ("resource.k8s.io", "resourceclaims", "list"),
    "list_namespaced_resource_claim": ("resource.k8s.io", "resourceclaims", "list"),
    "replace_namespaced_resource_claim_status": (
        "resource.k8s.io",
        "resourceclaims/status",
        "update",
    ),
}


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def find(path: Path, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in documents(path)
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{path.name}: {len(found)} {kind} {name or ''}"
    return found[0]


def scheduler_pod() -> dict[str, Any]:
    return find(DEPLOY / "scheduler.yaml", "Deployment", "gpushare-scheduler")["spec"]["template"]


def container(name: str) -> dict[str, Any]:
    return next(c for c in scheduler_pod()["spec"]["containers"] if c["name"] == name)


def scheduler_config() -> dict[str, Any]:
    data = find(DEPLOY / "scheduler.yaml", "ConfigMap", "gpushare-scheduler-config")["data"]
    return yaml.safe_load(data["gpushare-scheduler.yaml"])


def serve_args() -> dict[str, str]:
    """``--name=value`` (or a flag) of the gpushare container: {name: value}."""
    args = container("gpushare")["args"]
    assert args[:2] == ["kube", "serve"]
    parsed: dict[str, str] = {}
    for arg in args[2:]:
        assert arg.startswith("--"), f"{arg!r}: write options as --name=value"
        name, _, value = arg.partition("=")
        parsed[name] = value
    return parsed


def port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def kube_version() -> str:
    """The Kubernetes version the shipped kube-scheduler image is for."""
    tag = container("kube-scheduler")["image"].rpartition(":")[2]
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag), tag
    return tag[1:]


def validate(path: Path, *version: str) -> str:
    command = [str(BIN / "kubernetes-validate"), "--strict", *version, str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def rest_calls() -> dict[str, set[tuple[str, str, str]]]:
    """Port method -> the (group, resource, verb) its RestKubeApi implementation calls."""
    tree = ast.parse((REPO / "agent" / "kubeapi" / "rest.py").read_text())
    [rest] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RestKubeApi"]
    found: dict[str, set[tuple[str, str, str]]] = {}
    for method in rest.body:
        if not isinstance(method, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        nodes = list(ast.walk(method))
        called = {n.attr for n in nodes if isinstance(n, ast.Attribute)}
        calls = {c for c in called if c in CALLS}
        unknown = {
            c for c in called if re.fullmatch(r"(read|list|patch|create|delete|replace)_.*", c)
        }
        assert unknown <= set(CALLS), f"add {unknown - set(CALLS)} to CALLS"
        watch = method.name.startswith("watch_")  # the list call, with watch=true
        verbs = set()
        for call in calls:
            group, resource, verb = CALLS[call]
            verbs.add((group, resource, "watch" if watch and verb == "list" else verb))
        if verbs:
            found[method.name] = verbs
    return found


def assert_mounts_the_kubelet_dirs(daemonset: dict[str, Any], kubelet: dict[str, Any]) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    hosts = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    for path in (kubelet["plugin_dir"], str(Path(kubelet["pod_resources_socket"]).parent)):
        assert path in mounts, path
        assert hosts[mounts[path]] == path


def json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 test, replace and remove (what the kind patch uses)."""
    result = copy.deepcopy(document)
    for operation in operations:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]
        ]
        node: Any = result
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) else last
        if operation["op"] == "test":
            assert node[key] == operation["value"], operation
        elif operation["op"] == "replace":
            assert key in node if isinstance(node, dict) else key < len(node), operation
            node[key] = operation["value"]
        elif operation["op"] == "remove":
            del node[key]
        else:
            raise AssertionError(operation)
    return result
