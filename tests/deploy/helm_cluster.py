"""Helm's own install and upgrade (helm-python-sdk: Helm's Go code, its Kubernetes client
included) against a loopback stand-in of the API server, so that what a chart does only
where Helm talks to a cluster runs for real: ``lookup`` (the upgrade guard's live MPS host
DaemonSet, the token and certificates read back), ``.Release.IsUpgrade`` and Helm's
ownership checks.

The project's API stand-in (tests/kubeworld/apiserver/) serves the resources the agent and the
cluster side use, not discovery, Secrets or DaemonSets, so this one is its own, serving
exactly what Helm asks for (cert-manager's kinds too, as though it were installed):

- ``/version``, and legacy discovery (``/api``, ``/apis``, each group version's resource
  list) of the kinds the chart renders;
- GET of an object and of a list (``labelSelector`` of ``k=v`` terms), POST, PUT, DELETE;
- PATCH as Helm 4 sends it (server-side apply, ``application/apply-patch+yaml``): the sent
  object replaces the stored one, as an apply by a manager that owns every field would;
  any other PATCH keeps the stored object;
- objects as sent (but a Secret's ``stringData``, written into ``data`` as the real server
  does): no defaulting, no validation, no protobuf (Helm's release records are
  kept in Helm's memory driver, not as Secrets, which its typed client would send as
  protobuf). OpenAPI validation is turned off in the calls (it needs the server's
  protobuf OpenAPI document); tests/deploy/test_chart.py validates the rendered objects
  against Kubernetes' schemas instead.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import helm_python
import yaml
from helm_python import _native
from helm_python.config import _NONE

Obj = dict[str, Any]
# group/version -> (kind, resource, namespaced) of every kind the chart renders.
RESOURCES: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [
        ("Namespace", "namespaces", False),
        ("ConfigMap", "configmaps", True),
        ("Secret", "secrets", True),
        ("Service", "services", True),
        ("ServiceAccount", "serviceaccounts", True),
    ],
    "apps/v1": [("DaemonSet", "daemonsets", True), ("Deployment", "deployments", True)],
    "batch/v1": [("Job", "jobs", True)],
    "policy/v1": [("PodDisruptionBudget", "poddisruptionbudgets", True)],
    "networking.k8s.io/v1": [("NetworkPolicy", "networkpolicies", True)],
    "scheduling.k8s.io/v1": [("PriorityClass", "priorityclasses", False)],
    "rbac.authorization.k8s.io/v1": [
        ("ClusterRole", "clusterroles", False),
        ("ClusterRoleBinding", "clusterrolebindings", False),
        ("Role", "roles", True),
        ("RoleBinding", "rolebindings", True),
    ],
    "admissionregistration.k8s.io/v1": [
        ("MutatingWebhookConfiguration", "mutatingwebhookconfigurations", False),
        ("ValidatingWebhookConfiguration", "validatingwebhookconfigurations", False),
        ("ValidatingAdmissionPolicy", "validatingadmissionpolicies", False),
        ("ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings", False),
    ],
    "resource.k8s.io/v1": [("DeviceClass", "deviceclasses", False)],
    "cert-manager.io/v1": [
        ("Certificate", "certificates", True),
        ("Issuer", "issuers", True),
        ("ClusterIssuer", "clusterissuers", False),
    ],
}
PATH = re.compile(
    r"/(?:api/(?P<core>v1)|apis/(?P<gv>[^/]+/[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?(?:/(?P<resource>[^/]+))?(?:/(?P<name>[^/]+))?"
)
Key = tuple[str, str, str, str]  # (group/version, resource, namespace, name)


def status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


class HelmCluster:
    """The stand-in, on 127.0.0.1 while in ``with``; ``objects`` by (group/version,
    resource, namespace, name)."""

    def __init__(self, kube_version: str = "v1.34.2") -> None:
        self.kube_version = kube_version
        self.objects: dict[Key, Obj] = {}
        self.requests: list[tuple[str, str]] = []
        self._versions = itertools.count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HelmCluster:
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the objects -------------------------------------------------------------------

    def put(self, obj: Obj) -> None:
        """Store ``obj`` as though another tool had made it."""
        group_version, kind = obj["apiVersion"], obj["kind"]
        resource, namespaced = next((r, n) for k, r, n in RESOURCES[group_version] if k == kind)
        namespace = obj["metadata"].get("namespace", "") if namespaced else ""
        self._store((group_version, resource, namespace, obj["metadata"]["name"]), obj)

    def get(self, api_version: str, resource: str, namespace: str, name: str) -> Obj | None:
        found = self.objects.get((api_version, resource, namespace, name))
        return copy.deepcopy(found)

    def _store(self, key: Key, obj: Obj) -> Obj:
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._versions))
        meta.setdefault("uid", f"uid-{key[3]}-{meta['resourceVersion']}")
        if key[2]:
            meta["namespace"] = key[2]
        if key[1] == "secrets":  # as the real server: stringData is written into data
            data = stored.setdefault("data", {})
            for name, text in (stored.pop("stringData", None) or {}).items():
                data[name] = base64.b64encode(str(text).encode()).decode()
        self.objects[key] = stored
        return stored

    # -- serving -----------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                with cluster._lock:
                    cluster.requests.append((self.command, self.path))
                    code, answer = cluster._answer(
                        self.command, self.path, body, self.headers.get("Content-Type") or ""
                    )
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, *_args: Any) -> None:
                pass

        return Handler

    def _answer(self, method: str, path: str, body: bytes, content_type: str) -> tuple[int, Obj]:
        url = urlsplit(path)
        discovery = self._discovery(url.path)
        if discovery is not None:
            return 200, discovery
        match = PATH.fullmatch(url.path)
        group_version = match and (match["core"] or match["gv"])
        if not match or group_version not in RESOURCES or not match["resource"]:
            return 404, status(404, "NotFound", f"the server could not find {url.path}")
        key = (group_version, match["resource"], match["ns"] or "", match["name"] or "")
        if method == "GET" and not match["name"]:
            return 200, self._list(key, parse_qs(url.query).get("labelSelector", [""])[0])
        if method == "POST":
            obj = yaml.safe_load(body)
            return 201, self._store((*key[:3], obj["metadata"]["name"]), obj)
        found = self.objects.get(key)
        if method == "PATCH" and "apply-patch" in content_type:
            return (200 if found else 201), self._store(key, yaml.safe_load(body))
        if found is None:
            return 404, status(404, "NotFound", f'{key[1]} "{key[3]}" not found')
        if method == "GET":
            return 200, found
        if method in ("PUT", "PATCH"):
            return 200, self._store(key, yaml.safe_load(body) if method == "PUT" else found)
        del self.objects[key]
        return 200, found

    def _discovery(self, path: str) -> Obj | None:
        if path == "/version":
            minor = self.kube_version.split(".")[1]
            return {"major": "1", "minor": minor, "gitVersion": self.kube_version}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/apis":
            groups = []
            for group_version in RESOURCES:
                if group_version == "v1":
                    continue
                group, version = group_version.split("/")
                entry = {"groupVersion": group_version, "version": version}
                groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        group_version = path.removeprefix("/api/").removeprefix("/apis/")
        if group_version not in RESOURCES:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [
                {
                    "name": resource,
                    "singularName": kind.lower(),
                    "namespaced": namespaced,
                    "kind": kind,
                    "verbs": ["create", "delete", "get", "list", "patch", "update"],
                }
                for kind, resource, namespaced in RESOURCES[group_version]
            ],
        }

    def _list(self, key: Key, selector: str) -> Obj:
        terms = [term.split("=", 1) for term in selector.split(",") if term]
        items = [
            obj
            for (group_version, resource, namespace, _name), obj in self.objects.items()
            if (group_version, resource) == key[:2]
            and key[2] in ("", namespace)
            and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in terms)
        ]
        return {"kind": "List", "apiVersion": key[0], "metadata": {}, "items": items}

    def kubeconfig(self, namespace: str) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
                "users": [{"name": "admin", "user": {"token": "stand-in"}}],
                "contexts": [
                    {
                        "name": "stand-in",
                        "context": {
                            "cluster": "stand-in",
                            "user": "admin",
                            "namespace": namespace,
                        },
                    }
                ],
                "current-context": "stand-in",
            }
        )


class Helm:
    """`helm install` and `helm upgrade` of a chart as release ``name`` in ``namespace``
    of a :class:`HelmCluster`; the releases kept in Helm's memory for this object's
    life."""

    def __init__(self, cluster: HelmCluster, chart: str, namespace: str, name: str) -> None:
        self.chart = helm_python.Chart.load(chart)
        self.namespace = namespace
        self.name = name
        self._config = helm_python.Config(
            kubeconfig_content=cluster.kubeconfig(namespace),
            namespace=namespace,
            storage_driver="memory",
        )

    def close(self) -> None:
        self._config.close()

    def install(self, values: Obj) -> Obj:
        return self._call("helm_install", values)

    def upgrade(self, values: Obj, *, dry_run: str | None = None) -> Obj:
        """``dry_run="server"``: rendered with the cluster (lookup) but nothing applied."""
        return self._call("helm_upgrade", values, dry_run=dry_run)

    def _call(self, action: str, values: Obj, **options: Any) -> Obj:
        answer = _native.call_string(
            action,
            self._config._raw(),
            _native.HANDLE(_NONE),
            self.chart._raw(),
            None,
            self.name,
            json.dumps(values),
            json.dumps(
                {
                    "namespace": self.namespace,
                    "disable_openapi_validation": True,
                    **{k: v for k, v in options.items() if v is not None},
                }
            ),
        )
        return json.loads(answer)  # type: ignore[no-any-return]


@contextmanager
def helm_on(cluster: HelmCluster, chart: str, namespace: str, name: str) -> Iterator[Helm]:
    helm = Helm(cluster, chart, namespace, name)
    try:
        yield helm
    finally:
        helm.close()
