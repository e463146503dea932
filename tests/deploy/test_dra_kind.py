"""The DRA driver's examples (deploy/dra/example.yaml) and its kind check
(deploy/kind/*-dra*, README.md): the pods and claims a user starts with, and the cluster,
script and walk-through that deploy them."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import yaml

from agent.dra.port import DRIVER_NAME
from agent.legacy.cluster.annotations import PREFIX, wants_share
from tests.deploy.dra_manifests import (
    CAPACITIES,
    DAEMONSET,
    DRA,
    FEATURE_GATES,
    KIND,
    PATCH,
    agent_config,
    quiet_example,
)
from tests.deploy.kube_manifests import documents, find

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
