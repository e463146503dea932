"""The DRA driver's manifests (deploy/dra/): the Kubernetes schemas of every version that
serves resource.k8s.io/v1, the device class, and the RBAC rules of the driver and of the
binding-answer controller against the calls each makes. The DaemonSet patch and the
agent's configuration are checked in test_dra_daemonset.py, the examples and the kind
check (deploy/kind/*-dra*) in test_dra_kind.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.dra.port import DRIVER_NAME
from agent.kubeapi.port import ResourceApi
from tests.deploy.dra_manifests import (
    CONTROLLER_CERTIFICATE,
    DAEMONSET,
    DRA,
    EXTENDED_RESOURCE,
    KIND,
    OBJECT_FILES,
    VERSIONS,
    agent_config,
    allows,
    dra_daemonset,
    grants,
    kind_dra_daemonset,
    quiet_example,
    validate,
)
from tests.deploy.kube_manifests import documents, find, rest_calls
from tests.helpers import REPO

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
