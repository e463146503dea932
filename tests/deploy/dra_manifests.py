"""The DRA driver's manifests (deploy/dra/) as the checks read them: their paths and the
values they must hold, the agent's configuration in them, a strict ``kubernetes-validate``
of a version with resource.k8s.io/v1, RBAC rules matched as RBAC matches them, and the
DaemonSet patched as the API server (strategic merge) and up-dra.sh patch it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.kube_manifests import find, json_patch
from tests.helpers import REPO

DRA = REPO / "deploy" / "dra"
KIND = REPO / "deploy" / "kind"
DAEMONSET = REPO / "daemonset"
BIN = Path(sys.executable).parent
PATCH = DRA / "daemonset-patch.yaml"
CONTROLLER_CERTIFICATE = DRA / "controller-certificate.yaml"  # cert-manager's kind
OBJECT_FILES = sorted(p for p in DRA.glob("*.yaml") if p not in (PATCH, CONTROLLER_CERTIFICATE))
# Every version whose schemas have resource.k8s.io/v1 (GA in 1.34) in kubernetes-validate.
VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
EXTENDED_RESOURCE = "gpushare.io/gpu"

# The `dra` settings the configurations write, with their defaults (enabled: true there):
# all of the agent's but those that go with an explicit api_server (DRA_KEYS) and the API
# timeout, left at their defaults, and shm_dir (SHM_DIR, the chart's shm.hostPath, which
# the mps-host pods mount: tests/deploy/test_chart.py).
DRA_DEFAULTS: dict[str, object] = {
    "enabled": False,
    "plugin_dir": "/var/lib/kubelet/plugins/gpushare.io",
    "registry_dir": "/var/lib/kubelet/plugins_registry",
    "cdi_dir": "/var/run/cdi",
    "api_server": "",
    "binding_conditions": True,
    "clients_per_device": 16,
    "default_memory": "8GiB",
    "default_thread_pct": 25,
    "slice_min_interval_s": 1.0,
    "reconcile_interval_s": 30,
}
DRA_KEYS = {*DRA_DEFAULTS, "shm_dir", "host_dev_root", "api_token_file", "api_ca"}
SHM_DIR = "/run/gpushare-shm"
CAPACITIES = {"memory", "threads", "clients"}
FEATURE_GATES = {
    "DRAConsumableCapacity",
    "DRADeviceBindingConditions",
    "DRAResourceClaimDeviceStatus",
    "DRADeviceTaints",
    "DRAExtendedResource",
}


def agent_config(path: Path) -> dict[str, Any]:
    return yaml.safe_load(config_text(path))  # type: ignore[no-any-return]


def config_text(path: Path) -> str:
    return str(find(path, "ConfigMap")["data"]["config.yaml"])


def validate(path: Path, version: str) -> None:
    command = [str(BIN / "kubernetes-validate"), "--strict", "-k", version, str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Couldn't find schema" not in output, output


def quiet_example() -> dict[str, Any]:
    """The commented ResourceClaimTemplate of example.yaml, uncommented."""
    lines = (DRA / "example.yaml").read_text().splitlines()
    start = lines.index("# apiVersion: resource.k8s.io/v1")
    block = []
    for line in lines[start:]:
        if line == "#":
            break
        assert line.startswith("# "), line
        block.append(line[2:])
    return yaml.safe_load("\n".join(block))  # type: ignore[no-any-return]


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str | None]]:
    return {
        (group, resource, verb, name)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [None]
    }


def allows(
    rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str | None
) -> bool:
    """RBAC's own matching: a rule with resourceNames allows only requests for those names."""
    for rule in rules:
        names = rule.get("resourceNames") or []
        if (
            (group in rule["apiGroups"] or "*" in rule["apiGroups"])
            and (resource in rule["resources"] or "*" in rule["resources"])
            and (verb in rule["verbs"] or "*" in rule["verbs"])
            and (not names or name in names)
        ):
            return True
    return False


MERGE_KEYS = {"containers": "name", "volumes": "name", "volumeMounts": "mountPath", "env": "name"}


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """A strategic-merge patch as the API server applies it to the fields this patch
    uses: maps merge, the lists of MERGE_KEYS merge by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value, key) if key in base else value
        return merged
    if field in MERGE_KEYS and isinstance(base, list) and isinstance(patch, list):
        key = MERGE_KEYS[field]
        merged_list = list(base)
        for item in patch:
            at = [i for i, old in enumerate(merged_list) if old[key] == item[key]]
            if at:
                merged_list[at[0]] = strategic_merge(merged_list[at[0]], item)
            else:
                merged_list.append(item)
        return merged_list
    return patch


def by_key(document: Any, field: str = "") -> Any:
    """The lists of MERGE_KEYS as maps by their key (order-free comparison)."""
    if isinstance(document, dict):
        return {k: by_key(v, k) for k, v in document.items()}
    if isinstance(document, list):
        if field in MERGE_KEYS:
            return {item[MERGE_KEYS[field]]: by_key(item) for item in document}
        return [by_key(item) for item in document]
    return document


def shipped_daemonset() -> dict[str, Any]:
    return find(DAEMONSET / "daemonset.yaml", "DaemonSet")


def dra_daemonset() -> dict[str, Any]:
    return strategic_merge(shipped_daemonset(), yaml.safe_load(PATCH.read_text()))  # type: ignore[no-any-return]


def kind_dra_daemonset() -> dict[str, Any]:
    """up-dra.sh's: the simulated node's JSON patch, then the DRA patch."""
    simulated = json_patch(
        shipped_daemonset(), yaml.safe_load((KIND / "agent-daemonset-patch.yaml").read_text())
    )
    return strategic_merge(simulated, yaml.safe_load(PATCH.read_text()))  # type: ignore[no-any-return]


def agent_container(daemonset: dict[str, Any]) -> dict[str, Any]:
    return next(
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"
    )


def assert_mounts_the_dra_dirs(daemonset: dict[str, Any], dra: dict[str, Any]) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in agent_container(daemonset)["volumeMounts"]}
    for key in ("plugin_dir", "registry_dir", "cdi_dir"):
        path = dra[key]
        assert path in mounts, f"dra.{key} {path} is not mounted"
        assert not mounts[path].get("readOnly"), path
        assert volumes[mounts[path]["name"]]["hostPath"] == {
            "path": path,  # the same path inside: the kubelet dials what GetInfo names
            "type": "DirectoryOrCreate",
        }
