"""core/v1: pods (defaults, the immutable spec, graceful deletion with finalizers, the
``binding`` subresource, the kubelet's status writes), nodes and events."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from aiohttp import web

from tests.kubeworld.apiserver.errors import ApiError, conflict
from tests.kubeworld.apiserver.objects import Kind, Obj, copy_json, timestamp
from tests.kubeworld.apiserver.params import int_param, read_json
from tests.kubeworld.apiserver.patch import MERGE_PATCH

_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "tolerations", "schedulingGates")

PODS = Kind(
    "pods",
    "Pod",
    "v1",
    True,
    frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
)
NODES = Kind("nodes", "Node", "v1", False, frozenset({"metadata.name", "spec.unschedulable"}))
EVENTS = Kind(
    "events",
    "Event",
    "v1",
    True,
    frozenset(
        {"metadata.name", "metadata.namespace", "reason", "reportingComponent", "source", "type"}
        | {f"involvedObject.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion")}
        | {"involvedObject.resourceVersion", "involvedObject.fieldPath"}
    ),
)


def pod_manifest(
    name: str,
    namespace: str = "default",
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    scheduler_name: str = "",
    node_name: str = "",
    finalizers: Iterable[str] = (),
    limits: Mapping[str, Any] | None = None,
    image: str = "registry.example/train:1.0",
    run_as_user: int | None = None,
) -> Obj:
    """A pod as ``kubectl apply`` sends it; ``run_as_user``: its
    ``spec.securityContext.runAsUser``."""
    container: Obj = {"name": "main", "image": image, "command": ["python", "train.py"]}
    if limits:
        container["resources"] = {"limits": dict(limits)}
    spec: Obj = {"containers": [container]}
    if run_as_user is not None:
        spec["securityContext"] = {"runAsUser": run_as_user}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if node_name:
        spec["nodeName"] = node_name
    metadata: Obj = {"name": name, "namespace": namespace}
    for key, value in (("annotations", annotations), ("labels", labels)):
        if value:
            metadata[key] = dict(value)
    if finalizers := list(finalizers):
        metadata["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _qos(spec: Obj) -> str:
    resources = [c.get("resources") or {} for c in spec.get("containers") or []]
    if not any(r.get("limits") or r.get("requests") for r in resources):
        return "BestEffort"
    for r in resources:
        limits = r.get("limits") or {}
        requests = r.get("requests") or limits
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name) != limits[name]:
                return "Burstable"
    return "Guaranteed"


def default_pod(pod: Obj) -> None:
    """The defaults and the status the real server gives a new pod."""
    spec = pod.setdefault("spec", {})
    for key, value in (
        ("schedulerName", "default-scheduler"),
        ("restartPolicy", "Always"),
        ("terminationGracePeriodSeconds", 30),
        ("dnsPolicy", "ClusterFirst"),
        ("serviceAccountName", "default"),
        ("securityContext", {}),
        ("enableServiceLinks", True),
        ("priority", 0),
        ("preemptionPolicy", "PreemptLowerPriority"),
    ):
        spec.setdefault(key, value)
    for container in spec.get("containers") or []:
        latest = ":" not in str(container.get("image", "")).rsplit("/", 1)[-1]
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
    spec.setdefault("tolerations", [])
    for taint in ("not-ready", "unreachable"):
        toleration = {
            "key": f"node.kubernetes.io/{taint}",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        }
        if not any(t.get("key") == toleration["key"] for t in spec["tolerations"]):
            spec["tolerations"].append(toleration)
    pod["status"] = {"phase": "Pending", "qosClass": _qos(spec)}


def _pod_spec_frozen(spec: Obj) -> Obj:
    frozen = {k: v for k, v in spec.items() if k not in _MUTABLE_POD_SPEC}
    for key in ("containers", "initContainers"):
        if key in frozen:
            frozen[key] = [{k: v for k, v in c.items() if k != "image"} for c in frozen[key]]
    return frozen


# -- resource.k8s.io/v1: decoding and validation --------------------------------------------
#
# A write of a resource.k8s.io object goes through the real server's two stages: decoding,
# whose failures are 400s (a value of the wrong JSON type, a quantity or a time that does not
# parse, and, with ``fieldValidation=Strict``, an unknown field), then validation, whose
# failures are one 422 ``Invalid`` listing every field error. The schema part of both comes
# from the strict JSON schemas of the ``kubernetes-validate`` package for one Kubernetes


# the state the kubelet reports for every container of a pod in that phase
CONTAINER_STATES: dict[str, Obj] = {
    "Running": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    "Succeeded": {"terminated": {"exitCode": 0, "reason": "Completed"}},
    "Failed": {"terminated": {"exitCode": 1, "reason": "Error"}},
}


def check_pod_update(stored: Obj, new: Obj) -> None:
    name = stored["metadata"]["name"]
    if _pod_spec_frozen(new.get("spec") or {}) != _pod_spec_frozen(stored["spec"]):
        raise ApiError(
            422,
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other '
            "than `spec.containers[*].image`, `spec.initContainers[*].image`, "
            "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
            "tolerations), `spec.terminationGracePeriodSeconds`",
        )
    if stored["metadata"].get("deletionTimestamp"):
        added = set(new["metadata"].get("finalizers") or []) - set(
            stored["metadata"].get("finalizers") or []
        )
        if added:
            raise ApiError(
                422,
                f'Pod "{name}" is invalid: metadata.finalizers: Forbidden: no new finalizers can '
                f"be added if the object is being deleted, found new finalizers {sorted(added)}",
            )


class CoreV1:
    """The core/v1 part of :class:`FakeApiServer`: the routes, handlers and test helpers of
    pods, nodes and events (on the server's store, through ``self``)."""

    def _core_routes(self) -> None:
        ns = "/api/v1/namespaces/{namespace}"
        add = self.app.router.add_route
        for path, kind in (
            ("/api/v1/pods", PODS),
            (f"{ns}/pods", PODS),
            ("/api/v1/nodes", NODES),
            ("/api/v1/events", EVENTS),
            (f"{ns}/events", EVENTS),
        ):
            add("GET", path, partial(self._list, kind))
        for path, kind in (
            (f"{ns}/pods", PODS),
            ("/api/v1/nodes", NODES),
            (f"{ns}/events", EVENTS),
        ):
            add("POST", path, partial(self._create, kind))
            add("GET", path + "/{name}", partial(self._get, kind))
            add("PATCH", path + "/{name}", partial(self._patch, kind, ""))
        for path, kind in ((f"{ns}/pods", PODS), ("/api/v1/nodes", NODES)):
            add("GET", path + "/{name}/status", partial(self._get, kind))
            add("PATCH", path + "/{name}/status", partial(self._patch, kind, "status"))
        add("DELETE", f"{ns}/pods/{{name}}", self._delete_pod)
        add("DELETE", "/api/v1/nodes/{name}", self._delete_node)
        add("POST", f"{ns}/pods/{{name}}/binding", self._bind)

    async def _delete_pod(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        body = await read_json(request) if request.can_read_body else {}
        if not isinstance(body, dict):
            raise ApiError(400, "the body is not DeleteOptions")
        grace = request.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        seconds = None if grace is None else int_param(str(grace), "gracePeriodSeconds")
        preconditions = body.get("preconditions") or {}
        return web.json_response(self._delete(m["namespace"], m["name"], seconds, preconditions))

    def _delete(
        self, namespace: str, name: str, grace: int | None, preconditions: Mapping[str, str]
    ) -> Obj:
        stored = self._find(PODS, namespace, name)
        meta = stored["metadata"]
        for key in ("uid", "resourceVersion"):
            if preconditions.get(key) and preconditions[key] != meta[key]:
                why = (
                    f"Precondition failed: {key} in precondition: {preconditions[key]}, "
                    f"{key} in object meta: {meta[key]}"
                )
                raise conflict("pods", name, why)
        if grace is None:
            grace = stored["spec"].get("terminationGracePeriodSeconds", 30)
        ended = stored["status"].get("phase") in ("Succeeded", "Failed")
        if ended or not stored["spec"].get("nodeName"):
            grace = 0  # what the real server does for unscheduled and terminated pods
        if not meta.get("finalizers"):
            return self._commit(PODS, "DELETED", stored, copy_json(stored))
        if meta.get("deletionTimestamp") and grace >= meta.get("deletionGracePeriodSeconds", 0):
            return copy_json(stored)  # being deleted already
        new = copy_json(stored)
        new["metadata"].update(deletionTimestamp=timestamp(grace), deletionGracePeriodSeconds=grace)
        return self._commit(PODS, "MODIFIED", new, copy_json(stored))

    async def _delete_node(self, request: web.Request) -> web.StreamResponse:
        stored = self._find(NODES, "", request.match_info["name"])
        return web.json_response(self._commit(NODES, "DELETED", stored, copy_json(stored)))

    async def _bind(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        name = m["name"]
        body = await read_json(request)
        if not isinstance(body, dict) or body.get("kind", "Binding") != "Binding":
            raise ApiError(400, "the object provided is not a Binding")
        meta = body.get("metadata") or {}
        if meta.get("name", name) != name:
            raise ApiError(400, "name in URL does not match name in Binding object")
        target = body.get("target") or {}
        if not target.get("name") or target.get("kind", "Node") != "Node":
            raise ApiError(422, f'Binding "{name}" is invalid: target.name: Required value')
        stored = self._find(PODS, m["namespace"], name)
        uid = stored["metadata"]["uid"]
        if meta.get("uid") and meta["uid"] != uid:
            why = (
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {uid}"
            )
            raise conflict("pods", name, why)
        if stored["metadata"].get("deletionTimestamp"):
            raise conflict(
                "pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        if node := stored["spec"].get("nodeName"):
            raise conflict("pods/binding", name, f'pod {name} is already assigned to node "{node}"')
        new = copy_json(stored)
        new["spec"]["nodeName"] = target["name"]
        if annotations := meta.get("annotations"):
            new["metadata"].setdefault("annotations", {}).update(annotations)
        conditions = [
            c for c in new["status"].get("conditions") or [] if c.get("type") != "PodScheduled"
        ]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": timestamp(),
            }
        )
        new["status"]["conditions"] = conditions
        self._commit(PODS, "MODIFIED", new, copy_json(stored))
        success = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }
        return web.json_response(success, status=201)

    def create_pod(
        self, name: str, namespace: str = "default", *, phase: str = "", **manifest: Any
    ) -> Obj:
        """Create a pod (:func:`pod_manifest`'s arguments) as if POSTed; with ``phase`` it is
        created in that phase (a pod that was running before the test)."""
        pod = pod_manifest(name, namespace, **manifest)
        if not phase:
            return self._insert(PODS, namespace, pod)
        stored = self._insert(PODS, namespace, pod)  # one ADDED, then the kubelet's status
        return self.set_pod_phase(namespace, stored["metadata"]["name"], phase)

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> Obj:
        """What the kubelet writes (``status`` only): MODIFIED."""
        stored = self._find(PODS, namespace, name)
        new = copy_json(stored)
        new["status"]["phase"] = phase
        state = CONTAINER_STATES.get(phase, {"waiting": {"reason": "ContainerCreating"}})
        new["status"]["containerStatuses"] = [
            {"name": c.get("name", ""), "state": copy_json(state), "ready": "running" in state}
            for c in (new.get("spec") or {}).get("containers") or []
        ]
        return self._update(PODS, stored, new)

    def patch_pod(
        self,
        namespace: str,
        name: str,
        patch: Any,
        *,
        content_type: str = MERGE_PATCH,
        subresource: str = "",
    ) -> Obj:
        """A PATCH as if sent (same checks, same events), without a round trip; raises
        :class:`ApiError` where the server would answer with an error."""
        return self._patch_object(PODS, namespace, name, content_type, patch, subresource)

    def pod(self, namespace: str, name: str) -> Obj | None:
        found = self.objects["pods"].get((namespace, name))
        return copy_json(found) if found else None

    def delete_pod(self, namespace: str, name: str, force: bool = False) -> Obj:
        """``kubectl delete pod`` (``--force --grace-period=0`` with ``force``)."""
        return self._delete(namespace, name, 0 if force else None, {})

    def create_node(
        self, name: str, *, labels: Mapping[str, str] | None = None, ready: bool = True
    ) -> Obj:
        node: Obj = {
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": {},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if ready else "False",
                        "reason": "KubeletReady",
                    },
                    {
                        "type": "MemoryPressure",
                        "status": "False",
                        "reason": "KubeletHasSufficientMemory",
                    },
                ],
                "addresses": [{"type": "Hostname", "address": name}],
            },
        }
        return self._insert(NODES, "", node)

    def node(self, name: str) -> Obj | None:
        found = self.objects["nodes"].get(("", name))
        return copy_json(found) if found else None

    def events_for(self, pod_name: str, namespace: str = "") -> list[Obj]:
        """The events about ``pod_name``, in the order they were created."""
        found = [
            e
            for e in self.objects["events"].values()
            if (e.get("involvedObject") or {}).get("name") == pod_name
            and (not namespace or e["metadata"]["namespace"] == namespace)
        ]
        return sorted(
            (copy_json(e) for e in found), key=lambda e: int(e["metadata"]["resourceVersion"])
        )
