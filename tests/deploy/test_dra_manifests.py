"""The DRA driver's manifests (deploy/dra/) and its kind check (deploy/kind/*-dra*): the
Kubernetes schemas of every version that serves resource.k8s.io/v1, the RBAC rules
against the calls the driver makes, the DaemonSet patch against the agent's settings and
the kubelet's paths, the configuration against the shipped one, and the examples."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config.loading import env_name, load_settings, setting_fields
from agent.dra.port import DRIVER_NAME
from agent.kubeapi.connection import SERVICE_ACCOUNT
from agent.kubeapi.port import ResourceApi
from agent.legacy.cluster.annotations import PREFIX, wants_share
from tests.deploy.test_kube_manifests import json_patch, rest_calls
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

# What the driver calls, as (API group, resource, verb, resource name or None for any):
# the ResourceApi methods the driver's code calls, each as its adapter sends it, and the
# authorization the API server asks from 1.36 for the claim-status write.
RESOURCE = "resource.k8s.io"


def driver_calls() -> set[tuple[str, str, str, str | None]]:
    methods = [n for n in vars(ResourceApi) if not n.startswith("_") and n != "aclose"]
    sources = [
        p.read_text()
        for d in ("dra", "claims", "runtime")
        for p in (REPO / "agent" / d).glob("*.py")
    ]
    used = {m for m in methods if any(re.search(rf"\.{m}\(", text) for text in sources)}
    calls = rest_calls()
    return {(g, r, v, None) for m in used for g, r, v in calls[m]}


def doctor_calls() -> set[tuple[str, str, str, str | None]]:
    """What ``gpushare doctor`` asks the API when run in the agent's pod, where it has the
    driver's token (the Node, the RuntimeClass): the role lets it."""
    text = (REPO / "agent" / "cli" / "doctor.py").read_text()
    calls = rest_calls()
    return {(g, r, v, None) for m in calls if re.search(rf"\.{m}\(", text) for g, r, v in calls[m]}


NEEDED = driver_calls() | doctor_calls()
# Calls the driver never makes: each must be refused.
REFUSED = [
    ("", "pods", "delete", None),
    ("", "pods", "list", None),
    ("", "secrets", "get", None),
    ("", "configmaps", "get", None),
    ("", "events", "create", None),
    ("", "nodes", "list", None),
    ("", "nodes", "patch", None),
    ("", "nodes/status", "patch", None),
    (RESOURCE, "resourceslices", "deletecollection", None),
    (RESOURCE, "resourceclaims", "create", None),
    (RESOURCE, "resourceclaims", "update", None),
    (RESOURCE, "resourceclaims", "patch", None),
    (RESOURCE, "resourceclaims", "delete", None),
    (RESOURCE, "resourceclaims/status", "get", None),
    # no agent watches claims or writes their status: the controller answers for them
    (RESOURCE, "resourceclaims", "watch", None),
    (RESOURCE, "resourceclaims/status", "update", None),
    (RESOURCE, "resourceclaims/driver", "associated-node:update", DRIVER_NAME),
    (RESOURCE, "resourceclaims/binding", "update", None),
    (RESOURCE, "resourceclaims/driver", "associated-node:update", "other.example.com"),
    (RESOURCE, "resourceclaims/driver", "arbitrary-node:update", DRIVER_NAME),
    (RESOURCE, "resourceclaims/driver", "update", DRIVER_NAME),
    (RESOURCE, "drivers", "update-device-status", "other.example.com"),
    (RESOURCE, "deviceclasses", "create", None),
    (RESOURCE, "deviceclasses", "update", None),
    (RESOURCE, "deviceclasses", "delete", None),
    (RESOURCE, "resourceclaimtemplates", "get", None),
    (RESOURCE, "devicetaintrules", "create", None),
]


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


# -- schemas -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("manifest", OBJECT_FILES, ids=lambda p: p.name)
def test_each_manifest_validates_in_every_version_with_dra(manifest: Path, version: str) -> None:
    validate(manifest, version)
    for document in documents(manifest):
        assert document["metadata"]["name"]
        if document["kind"] in ("ConfigMap", "Pod", "ResourceClaimTemplate"):
            assert document["metadata"].get("namespace"), f"{manifest.name}: {document['kind']}"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_patched_daemonsets_and_the_commented_example_validate(
    version: str, tmp_path: Path
) -> None:
    for name, document in (
        ("daemonset.yaml", dra_daemonset()),
        ("kind-daemonset.yaml", kind_dra_daemonset()),
        ("quiet.yaml", quiet_example()),
        ("kind-agent-config.yaml", find(KIND / "agent-config-dra.yaml", "ConfigMap")),
    ):
        path = tmp_path / name
        path.write_text(yaml.safe_dump(document))
        validate(path, version)


# -- the device class ------------------------------------------------------------------------


def test_the_device_class_selects_the_driver_and_maps_the_extended_resource() -> None:
    path = DRA / "deviceclass.yaml"
    device_class = find(path, "DeviceClass")
    assert device_class["apiVersion"] == "resource.k8s.io/v1"
    assert device_class["metadata"]["name"] == DRIVER_NAME
    [selector] = device_class["spec"]["selectors"]
    assert selector["cel"]["expression"] == f'device.driver == "{DRIVER_NAME}"'
    assert device_class["spec"]["extendedResourceName"] == EXTENDED_RESOURCE
    assert "config" not in device_class["spec"]
    # the comment tells the default share the agent's configuration gives
    dra = agent_config(DRA / "agent-config.yaml")["dra"]
    text = path.read_text()
    assert f'"{dra["default_memory"]}"' in text and "dra.default_memory" in text
    assert re.search(rf"threads\s+{dra['default_thread_pct']} \(dra\.default_thread_pct", text)
    assert re.search(r"clients\s+1 ", text)


# -- RBAC --------------------------------------------------------------------------------------


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


def driver_role() -> dict[str, Any]:
    return find(DRA / "rbac.yaml", "ClusterRole", "gpushare-dra-driver")


def test_the_driver_role_grants_exactly_what_the_driver_calls() -> None:
    granted = grants(driver_role()["rules"])
    assert granted == NEEDED, (
        f"granted, not used: {granted - NEEDED}; used, not granted: {NEEDED - granted}"
    )
    assert all("*" not in str(item) for grant in granted for item in grant)
    assert {d["kind"] for d in documents(DRA / "rbac.yaml")} == {
        "ClusterRole",
        "ClusterRoleBinding",
    }  # the account is daemonset/rbac.yaml's: no second one, no namespaced role


@pytest.mark.parametrize("call", sorted(NEEDED, key=str), ids=str)
def test_each_call_of_the_driver_is_allowed(call: tuple[str, str, str, str | None]) -> None:
    group, resource, verb, name = call
    assert allows(driver_role()["rules"], group, resource, verb, name or "any-name")


@pytest.mark.parametrize("call", REFUSED, ids=str)
def test_what_the_driver_never_calls_is_refused(call: tuple[str, str, str, str | None]) -> None:
    assert not allows(driver_role()["rules"], *call)


def test_the_role_is_bound_to_the_agents_account_and_no_other() -> None:
    account = find(DAEMONSET / "rbac.yaml", "ServiceAccount")
    binding = find(DRA / "rbac.yaml", "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": driver_role()["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    pod = dra_daemonset()["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_the_slice_policy_holds_the_agents_to_their_own_nodes_slices() -> None:
    path = DRA / "slice-policy.yaml"
    policy = find(path, "ValidatingAdmissionPolicy", "gpushare-dra-own-node-slices")
    binding = find(path, "ValidatingAdmissionPolicyBinding", "gpushare-dra-own-node-slices")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace: slices have none
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [RESOURCE] and rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    account = find(DAEMONSET / "rbac.yaml", "ServiceAccount")["metadata"]
    [match] = spec["matchConditions"]
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert match["expression"] == f'request.userInfo.username == "{user}"'
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert '"authentication.kubernetes.io/node-name"' in variables["callerNode"]
    assert "object.spec.nodeName" in variables["newNode"]
    assert "oldObject.spec.nodeName" in variables["oldNode"]
    checks = " ".join(v["expression"] for v in spec["validations"])
    assert f'object.spec.driver == "{DRIVER_NAME}"' in checks
    for needed in ('variables.callerNode != ""', "variables.newNode == variables.callerNode",
                   "variables.oldNode == variables.callerNode"):  # fmt: skip
        assert needed in checks, needed


# -- the DaemonSet ---------------------------------------------------------------------------

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


def test_the_patch_adds_the_kubelet_and_cdi_dirs_and_keeps_the_rest() -> None:
    patch = yaml.safe_load(PATCH.read_text())
    shipped_meta = shipped_daemonset()["metadata"]
    assert (patch["apiVersion"], patch["kind"]) == ("apps/v1", "DaemonSet")
    assert patch["metadata"] == {k: shipped_meta[k] for k in ("name", "namespace")}
    assert set(patch["spec"]) == {"template"} and set(patch["spec"]["template"]) == {"spec"}
    assert set(patch["spec"]["template"]["spec"]) == {"containers", "volumes"}
    [container] = patch["spec"]["template"]["spec"]["containers"]
    assert set(container) == {"name", "volumeMounts"} and container["name"] == "agent"
    daemonset = dra_daemonset()
    assert_mounts_the_dra_dirs(daemonset, agent_config(DRA / "agent-config.yaml")["dra"])
    shipped = shipped_daemonset()["spec"]["template"]["spec"]
    pod = daemonset["spec"]["template"]["spec"]
    assert all(v in pod["volumes"] for v in shipped["volumes"])
    shipped_agent = agent_container(shipped_daemonset())
    assert all(
        m in agent_container(daemonset)["volumeMounts"] for m in shipped_agent["volumeMounts"]
    )
    assert agent_container(daemonset)["env"] == shipped_agent["env"]
    assert {k: v for k, v in pod.items() if k not in ("volumes", "containers")} == {
        k: v for k, v in shipped.items() if k not in ("volumes", "containers")
    }


def test_the_patch_is_what_kubectl_makes_of_it() -> None:
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        ["kubectl", "patch", "--local", "-f", str(DAEMONSET / "daemonset.yaml"),
         "--type=strategic", "--patch-file", str(PATCH), "-o", "yaml"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert by_key(yaml.safe_load(done.stdout)["spec"]) == by_key(dra_daemonset()["spec"])


def test_the_agent_gets_its_node_name_and_an_api_token_of_its_own() -> None:
    daemonset = dra_daemonset()
    pod = daemonset["spec"]["template"]["spec"]
    agent = agent_container(daemonset)
    env = {e["name"]: e for e in agent["env"]}
    node = env[env_name("runtime.node_name")]
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # no token for every container of the account: one projected into the agent's
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    mount = mounts[SERVICE_ACCOUNT]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    sources = volume["projected"]["sources"]
    [token] = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    assert token["path"] == "token" and "audience" not in token  # the API server's own
    assert 600 <= token["expirationSeconds"] <= 3600
    [ca] = [s["configMap"] for s in sources if "configMap" in s]
    assert ca == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert (
        sum(1 for c in pod["containers"] for m in c["volumeMounts"] if m["name"] == mount["name"])
        == 1
    )
    mps_host = find(DAEMONSET / "mps-host.yaml", "DaemonSet")["spec"]["template"]["spec"]
    assert mps_host["automountServiceAccountToken"] is False


def test_the_sockets_fit_a_unix_socket_path() -> None:
    dra = agent_config(DRA / "agent-config.yaml")["dra"]
    for socket in (
        f"{dra['registry_dir']}/{DRIVER_NAME}-reg.sock",
        f"{dra['plugin_dir']}/dra.sock",
    ):
        assert len(socket.encode()) < 108, socket
    assert dra["plugin_dir"] == f"/var/lib/kubelet/plugins/{DRIVER_NAME}"


def test_the_kind_daemonset_mounts_the_simulated_dirs_and_the_dra_dirs() -> None:
    daemonset = kind_dra_daemonset()
    config = agent_config(KIND / "agent-config-dra.yaml")
    pod = daemonset["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod
    hosts = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in agent_container(daemonset)["volumeMounts"]}
    for name, key in (("run", "runtime_dir"), ("state", "state_dir")):
        assert hosts[name] == mounts[name] == config["paths"][key]
    assert_mounts_the_dra_dirs(daemonset, config["dra"])


# -- the agent's configuration -------------------------------------------------------------


def test_the_dra_config_is_the_shipped_one_with_dra_on_and_the_device_plugin_off() -> None:
    shipped_map = find(DAEMONSET / "configmap.yaml", "ConfigMap")
    ours = find(DRA / "agent-config.yaml", "ConfigMap")
    assert ours["metadata"] == shipped_map["metadata"]  # it replaces the shipped one
    volumes = shipped_daemonset()["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": ours["metadata"]["name"]}} in volumes
    shipped, config = (
        agent_config(DAEMONSET / "configmap.yaml"),
        agent_config(DRA / "agent-config.yaml"),
    )
    assert config["kubelet"] == {"enabled": False}
    different = {"kubelet", "dra"}
    assert {k: v for k, v in config.items() if k not in different} == {
        k: v for k, v in shipped.items() if k not in different
    }
    assert config["api"] == shipped["api"] and config["api"]["tls_client_ca_file"]  # mTLS
    dra = config["dra"]
    assert set(dra) <= DRA_KEYS, set(dra) - DRA_KEYS
    shipped_dra = {"enabled": True, "shm_dir": SHM_DIR, "host_dev_root": "/host/dev"}
    assert dra == DRA_DEFAULTS | shipped_dra


def test_the_kind_dra_config_is_the_dra_one_on_a_simulated_node() -> None:
    config = agent_config(KIND / "agent-config-dra.yaml")
    # A simulated node runs no mps-host pod (its agent runs fake daemons): no shm directory;
    # and its devices have no device nodes to read from the host's /dev.
    shipped = agent_config(DRA / "agent-config.yaml")["dra"]
    node_only = {"shm_dir", "host_dev_root"}
    assert config["dra"] == {k: v for k, v in shipped.items() if k not in node_only}
    assert config["sim"]["enabled"] is True and config["kubelet"] == {"enabled": False}
    kind = agent_config(KIND / "agent-config.yaml")
    different = {"kubelet", "dra"}
    assert {k: v for k, v in config.items() if k not in different} == {
        k: v for k, v in kind.items() if k not in different
    }
    assert config["api"] == agent_config(DAEMONSET / "configmap.yaml")["api"]


def dra_settings_known() -> bool:
    return "dra.enabled" in setting_fields()


@pytest.mark.parametrize(
    "path", [DRA / "agent-config.yaml", KIND / "agent-config-dra.yaml"], ids=lambda p: p.name
)
def test_the_agent_accepts_the_dra_configs_with_its_defaults(path: Path, tmp_path: Path) -> None:
    if not dra_settings_known():
        pytest.skip("the agent has no `dra` settings yet")
    text = config_text(path)
    config = tmp_path / "config.yaml"
    config.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--config", str(config), "config", "show", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ours, defaults = load_settings(text).dra, load_settings("version: 1").dra  # type: ignore[attr-defined]
    assert ours.enabled is True and defaults.enabled is False
    for key in DRA_DEFAULTS:
        if key != "enabled":
            assert getattr(ours, key) == getattr(defaults, key), key
    known = {key.split(".", 1)[1] for key in setting_fields() if key.startswith("dra.")}
    assert known >= DRA_KEYS, DRA_KEYS - known  # the plan's keys, all of them the agent's


# -- the examples --------------------------------------------------------------------------


def example_pods() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents(DRA / "example.yaml") if d["kind"] == "Pod"}


def test_the_claim_template_asks_for_a_quarter_of_a_gpu() -> None:
    template = find(DRA / "example.yaml", "ResourceClaimTemplate", "quarter-gpu")
    [request] = template["spec"]["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    assert (
        exactly["deviceClassName"]
        == find(DRA / "deviceclass.yaml", "DeviceClass")["metadata"]["name"]
    )
    assert exactly["capacity"]["requests"] == {"memory": "20Gi", "threads": "25"}
    assert set(exactly["capacity"]["requests"]) <= CAPACITIES
    pod = example_pods()["dra-claim-demo"]
    [claim] = pod["spec"]["resourceClaims"]
    assert claim == {"name": claim["name"], "resourceClaimTemplateName": "quarter-gpu"}
    [container] = pod["spec"]["containers"]
    assert container["resources"] == {"claims": [{"name": claim["name"]}]}


def test_the_extended_resource_pod_asks_for_the_class_resource() -> None:
    pod = example_pods()["dra-extended-demo"]
    [container] = pod["spec"]["containers"]
    extended = find(DRA / "deviceclass.yaml", "DeviceClass")["spec"]["extendedResourceName"]
    assert container["resources"] == {"limits": {extended: 1}}
    assert "resourceClaims" not in pod["spec"]


def test_the_example_pods_are_left_to_the_default_scheduler_and_locked_down() -> None:
    dockerfile = (DAEMONSET / "Dockerfile").read_text()
    gid = int(re.search(r"groupadd --system --gid (\d+) gpushare", dockerfile)[1])  # type: ignore[index]
    pods = example_pods()
    assert set(pods) == {"dra-claim-demo", "dra-extended-demo"}
    for name, pod in pods.items():
        assert pod["metadata"]["namespace"] not in ("gpushare-system", "kube-system")
        annotations = pod["metadata"].get("annotations") or {}
        assert not any(k.startswith(PREFIX) for k in annotations), name  # not the webhook's
        assert not wants_share(pod), name
        spec = pod["spec"]
        assert "schedulerName" not in spec
        assert not spec.get("hostPID") and not spec.get("hostNetwork") and not spec.get("volumes")
        assert spec["securityContext"]["supplementalGroups"] == [gid]  # the MPS pipe group
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"] == {"drop": ["ALL"]}, name
            assert not security.get("privileged"), name


def test_the_commented_quiet_selector_asks_for_a_quiet_unprotected_device() -> None:
    template = quiet_example()
    assert template["kind"] == "ResourceClaimTemplate"
    assert (
        template["metadata"]["namespace"]
        == find(DRA / "example.yaml", "Namespace")["metadata"]["name"]
    )
    [request] = template["spec"]["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    assert exactly["deviceClassName"] == DRIVER_NAME
    [selector] = exactly["selectors"]
    expression = " ".join(selector["cel"]["expression"].split())
    assert expression == (
        f'device.attributes["{DRIVER_NAME}"].retentionHeadroom == "quiet" && '
        f'device.attributes["{DRIVER_NAME}"].protected == false'
    )
    assert set(exactly["capacity"]["requests"]) <= CAPACITIES


# -- kind ------------------------------------------------------------------------------------


def test_the_kind_cluster_has_the_dra_gates_the_v1_api_and_cdi() -> None:
    cluster = yaml.safe_load((KIND / "kind-config-dra.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("kind.x-k8s.io/v1alpha4", "Cluster")
    gates = cluster["featureGates"]
    assert set(gates) >= FEATURE_GATES, FEATURE_GATES - set(gates)
    assert all(value is True for value in gates.values())
    assert cluster["runtimeConfig"] == {"resource.k8s.io/v1": "true"}
    [patch] = cluster["containerdConfigPatches"]
    assert re.search(r"^\s*enable_cdi = true$", patch, re.MULTILINE)
    roles = [n["role"] for n in cluster["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") >= 1


def test_up_dra_sh_is_sound_bash() -> None:
    path = KIND / "up-dra.sh"
    lines = path.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash" and "set -euo pipefail" in lines
    assert path.stat().st_mode & 0o111, "up-dra.sh is not executable"
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck"):
        done = subprocess.run(
            ["shellcheck", str(path)], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout


def test_up_dra_sh_deploys_the_driver_and_the_examples() -> None:
    up = (KIND / "up-dra.sh").read_text()
    assert '--config "$HERE/kind-config-dra.yaml"' in up
    assert 'docker build -f "$REPO/daemonset/Dockerfile" -t "$AGENT_IMAGE" "$REPO"' in up
    assert 'kind load docker-image "$AGENT_IMAGE"' in up
    applied = set(re.findall(r'-f "\$DRA/([\w.-]+\.yaml)"', up))
    replaced = {
        "agent-config.yaml": "the kind one, agent-config-dra.yaml",
        "controller-certificate.yaml": "the secret made with openssl",
    }
    for path in DRA.glob("*.yaml"):
        if path != PATCH:
            assert path.name in applied or path.name in replaced, path.name
    assert '-f "$HERE/agent-config-dra.yaml"' in up
    # the simulated node's positional JSON patch first, then the DRA strategic one
    json_at = up.index('--patch-file "$HERE/agent-daemonset-patch.yaml"')
    strategic_at = up.index('--type=strategic \\\n    --patch-file "$DRA/daemonset-patch.yaml"')
    assert json_at < strategic_at
    assert "resourceslices" in up and "gpushare leases" in up
    assert "/var/run/cdi/$DRIVER-claim_$uid.json" in up
    assert f"DRIVER={DRIVER_NAME}\n" in up
    assert agent_config(KIND / "agent-config-dra.yaml")["dra"]["cdi_dir"] == "/var/run/cdi"
    assert "--insecure-agents" not in up and "insecure_loopback" not in up
    assert "secret gpushare-dra-controller-agent-tls" in up  # the controller's certificate


def test_the_readme_walks_through_the_manual_check() -> None:
    readme = (KIND / "README.md").read_text()
    for needed in ("up-dra.sh", "kubectl get resourceslices -o yaml", "describe pod",
                   "gpushare leases", "/var/run/cdi/gpushare.io-claim_", "-- env",
                   "deploy/dra/daemonset-patch.yaml", "deploy/dra/agent-config.yaml"):  # fmt: skip
        assert needed in readme, needed


# -- the binding-answer controller (deploy/dra/controller.yaml) ------------------------------

CONTROLLER = DRA / "controller.yaml"
CONTROLLER_LEASE = "gpushare-dra-controller"


def controller_calls() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every adapter method ``gpushare dra controller`` calls:
    agent/dracontrol and the floor's leader election."""
    sources = [p.read_text() for p in (REPO / "agent" / "dracontrol").glob("*.py")]
    sources.append((REPO / "agent" / "kubeapi" / "leader.py").read_text())
    calls = rest_calls()
    used = {m for m in calls if any(re.search(rf"\.{m}\(", text) for text in sources)}
    return {call for m in used for call in calls[m]}


def test_the_controller_is_granted_exactly_what_it_calls() -> None:
    cluster = grants(find(CONTROLLER, "ClusterRole", "gpushare-dra-controller")["rules"])
    local = grants(find(CONTROLLER, "Role", "gpushare-dra-controller")["rules"])
    authorization = (RESOURCE, "resourceclaims/driver", "arbitrary-node:update", DRIVER_NAME)
    assert authorization in cluster  # the 1.36 status authorization, its driver only
    granted = {(g, r, v) for g, r, v, _ in (cluster | local) - {authorization}}
    needed = controller_calls()
    assert granted == needed, (
        f"granted, not used: {granted - needed}; not granted: {needed - granted}"
    )
    assert set(cluster) == {(g, r, v, None) for g, r, v in needed if g == RESOURCE} | {
        authorization
    }  # cluster-wide: the claims only
    for _group, resource, verb, name in local:
        if resource == "leases" and verb != "create":
            assert name == CONTROLLER_LEASE  # its own Lease only
        else:
            assert name is None
    assert all("*" not in str(item) for grant in cluster | local for item in grant)


def test_the_controllers_roles_are_bound_to_its_own_account() -> None:
    account = find(CONTROLLER, "ServiceAccount")
    subject = {
        "kind": "ServiceAccount",
        "name": account["metadata"]["name"],
        "namespace": account["metadata"]["namespace"],
    }
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = find(CONTROLLER, kind)
        assert binding["subjects"] == [subject]
        assert binding["roleRef"]["name"] == "gpushare-dra-controller"
    pod = find(CONTROLLER, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_the_controller_runs_two_replicas_elected_on_a_lease_in_its_namespace() -> None:
    deployment = find(CONTROLLER, "Deployment")
    namespace = deployment["metadata"]["namespace"]
    assert deployment["spec"]["replicas"] == 2
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["dra", "controller"]
    options = dict(a.split("=", 1) for a in args[2:])
    assert options["--leader-elect-namespace"] == namespace
    assert options["--leader-elect-lease"] == CONTROLLER_LEASE
    assert options["--agents-namespace"] == namespace
    # authenticated towards the agents as the extender path is: mutual TLS and the token
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for flag in ("--agent-ca", "--agent-cert", "--agent-key", "--agent-token-file"):
        directory = options[flag].rsplit("/", 1)[0]
        assert "secret" in volumes[mounts[directory]], flag
    token = volumes[mounts[options["--agent-token-file"].rsplit("/", 1)[0]]]
    assert token["secret"]["secretName"] == "gpushare-agent-token"
    tls = volumes[mounts[options["--agent-cert"].rsplit("/", 1)[0]]]
    certificate = documents(CONTROLLER_CERTIFICATE)
    assert [d["kind"] for d in certificate] == ["Certificate"]
    assert certificate[0]["spec"]["secretName"] == tls["secret"]["secretName"]
    assert certificate[0]["spec"]["usages"] == ["client auth"]


def test_the_controllers_options_are_ones_its_command_takes() -> None:
    from click.testing import CliRunner

    from agent.cli.main import cli

    deployment = find(CONTROLLER, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    shown = CliRunner().invoke(cli, ["dra", "controller", "--help"]).output
    for arg in container["args"][2:]:
        assert arg.split("=", 1)[0] in shown, arg
