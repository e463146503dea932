"""A container of the chart's rendered pods run with podman as the kubelet would run it:
its arguments, security context, host PID namespace, environment and volumes (hostPath under
a stand-in for the node's root, with its mount propagation; a configMap's file; emptyDir) are
read from the rendered objects, so that a change of the chart changes the run.

Only what the tests use is translated; anything else is refused by name, so that a new kind
of volume or field in the chart fails here rather than being left out silently."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# mountPropagation -> podman's bind propagation (kubelet: Bidirectional is rshared,
# HostToContainer rslave, None rprivate).
PROPAGATION = {"Bidirectional": "rshared", "HostToContainer": "rslave", "None": "rprivate"}


@dataclass
class PodRun:
    """The podman arguments before the image (``options``), after it (``args``) and where
    each hostPath volume lies on this machine (``host_paths``: container path -> host dir)."""

    options: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    host_paths: dict[str, Path] = field(default_factory=dict)

    def host_path(self, container_path: str) -> Path:
        """Where ``container_path`` (inside a hostPath mount) lies on this machine."""
        for mount, host in sorted(self.host_paths.items(), key=lambda kv: -len(kv[0])):
            if container_path == mount or container_path.startswith(mount.rstrip("/") + "/"):
                return host / container_path[len(mount) :].lstrip("/")
        raise KeyError(f"{container_path} is in no hostPath volume of the pod")


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every object of a render (deploy/helm/render.py's {template: text})."""
    docs: list[dict[str, Any]] = []
    for text in rendered.values():
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def find(docs: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name} in the render"
    return found[0]


def podman_run(
    docs: list[dict[str, Any]], workload: dict[str, Any], container: str, node_root: Path
) -> PodRun:
    """How podman runs ``container`` of ``workload``'s pod template: hostPath volumes are
    made under ``node_root`` (the stand-in for the node's ``/``), configMap files are written
    under ``node_root``/.configmaps."""
    pod = workload["spec"]["template"]["spec"]
    spec = next(c for c in pod["containers"] if c["name"] == container)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    run = PodRun()
    run.options += pod_options(pod)
    run.options += security_options(spec.get("securityContext", {}))
    for variable in spec.get("env", []):
        if "value" not in variable:
            raise ValueError(f"env {variable['name']}: only literal values are translated")
        run.options += ["-e", f"{variable['name']}={variable['value']}"]
    for mount in spec.get("volumeMounts", []):
        run.options += volume_options(docs, volumes[mount["name"]], mount, node_root, run)
    if "command" in spec:
        raise ValueError(f"container {container}: command (the entrypoint) is not translated")
    run.args = [str(a) for a in spec.get("args", [])]
    return run


def pod_options(pod: dict[str, Any]) -> list[str]:
    options = ["--pid=host"] if pod.get("hostPID") else []
    # The pod network is not reachable here: no network, unless the pod has the node's.
    return [*options, "--network=host" if pod.get("hostNetwork") else "--network=none"]


def security_options(context: dict[str, Any]) -> list[str]:
    known = {"privileged", "runAsUser", "runAsGroup", "readOnlyRootFilesystem"}
    if unknown := set(context) - known:
        raise ValueError(f"securityContext fields not translated: {sorted(unknown)}")
    options = ["--privileged"] if context.get("privileged") else []
    if "runAsUser" in context:
        options += ["--user", f"{context['runAsUser']}:{context.get('runAsGroup', 0)}"]
    if context.get("readOnlyRootFilesystem"):
        options.append("--read-only")
    return options


def volume_options(
    docs: list[dict[str, Any]],
    volume: dict[str, Any],
    mount: dict[str, Any],
    node_root: Path,
    run: PodRun,
) -> list[str]:
    target = mount["mountPath"]
    flags = ["ro"] if mount.get("readOnly") else []
    if "hostPath" in volume:
        host = node_root / volume["hostPath"]["path"].lstrip("/")
        if volume["hostPath"].get("type") in ("DirectoryOrCreate", "Directory"):
            host.mkdir(parents=True, exist_ok=True)
        run.host_paths[target] = host
        flags.append(PROPAGATION[mount.get("mountPropagation", "None")])
        return ["-v", f"{host}:{target}:{','.join(flags)}"]
    if "configMap" in volume:
        data = find(docs, "ConfigMap", volume["configMap"]["name"])["data"]
        folder = node_root / ".configmaps" / volume["name"]
        folder.mkdir(parents=True, exist_ok=True)
        for key, text in data.items():
            (folder / key).write_text(text)
        source = folder / mount["subPath"] if "subPath" in mount else folder
        return ["-v", f"{source}:{target}:{','.join(flags or ['ro'])}"]
    if "emptyDir" in volume:
        if volume["emptyDir"].get("medium") == "Memory":
            limit = volume["emptyDir"].get("sizeLimit")
            return ["--tmpfs", f"{target}:size={kubernetes_bytes(limit)}" if limit else target]
        folder = node_root / ".emptydirs" / volume["name"]
        folder.mkdir(parents=True, exist_ok=True)
        return ["-v", f"{folder}:{target}"]
    raise ValueError(f"volume {volume['name']}: its kind is not translated ({sorted(volume)})")


def kubernetes_bytes(quantity: str) -> int:
    """A binary-suffixed Kubernetes quantity (64Mi) in bytes."""
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)
