"""The kind bring-up of the extender path (deploy/kind/) and the agents (daemonset/) as the
cluster side needs them: the device plugin with the kubelet's dirs mounted, the kind
DaemonSet and configuration of the simulated agents, and up.sh / down.sh."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.kube_manifests import (
    DEPLOY,
    KIND,
    assert_mounts_the_kubelet_dirs,
    find,
    json_patch,
    kube_version,
    validate,
)
from tests.helpers import REPO

# -- the agents (daemonset/) as the cluster side needs them --------------------------------


def test_the_shipped_agents_serve_the_device_plugin_with_the_kubelet_dirs_mounted() -> None:
    config = yaml.safe_load(
        find(REPO / "daemonset" / "configmap.yaml", "ConfigMap")["data"]["config.yaml"]
    )
    kubelet = config["kubelet"]
    assert kubelet["enabled"] is True
    daemonset = find(REPO / "daemonset" / "daemonset.yaml", "DaemonSet")
    assert_mounts_the_kubelet_dirs(daemonset, kubelet)


# -- kind ------------------------------------------------------------------------------------


def kind_daemonset() -> dict[str, Any]:
    patch = yaml.safe_load((KIND / "agent-daemonset-patch.yaml").read_text())
    return json_patch(find(REPO / "daemonset" / "daemonset.yaml", "DaemonSet"), patch)


def test_the_kind_daemonset_validates_and_mounts_the_simulated_agents_dirs(tmp_path: Path) -> None:
    daemonset = kind_daemonset()
    manifest = tmp_path / "daemonset.yaml"
    manifest.write_text(yaml.safe_dump(daemonset))
    validate(manifest)
    validate(manifest, "-k", kube_version())
    pod = daemonset["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod
    config = yaml.safe_load(find(KIND / "agent-config.yaml", "ConfigMap")["data"]["config.yaml"])
    hosts = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    for name, key in (("run", "runtime_dir"), ("state", "state_dir")):
        assert hosts[name] == mounts[name] == config["paths"][key]
    assert_mounts_the_kubelet_dirs(daemonset, config["kubelet"])
    if shutil.which("kubectl"):  # the patch as up.sh applies it, where kubectl is installed
        done = subprocess.run(
            ["kubectl", "patch", "--local", "-f", str(REPO / "daemonset" / "daemonset.yaml"),
             "--type=json", "--patch-file", str(KIND / "agent-daemonset-patch.yaml"), "-o", "json"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["spec"] == daemonset["spec"]


def test_the_kind_agent_config_is_accepted_and_keeps_the_shipped_security(tmp_path: Path) -> None:
    text = find(KIND / "agent-config.yaml", "ConfigMap")["data"]["config.yaml"]
    config = yaml.safe_load(text)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    command = [sys.executable, "-m", "agent", "--config", str(path), "config", "show"]
    done = subprocess.run(
        [*command, "--resolved", "--json"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    shipped = yaml.safe_load(
        find(REPO / "daemonset" / "configmap.yaml", "ConfigMap")["data"]["config.yaml"]
    )
    assert config["api"] == shipped["api"]  # mutual TLS and the token, as shipped
    assert not config["api"].get("insecure_loopback")
    assert config["sim"]["enabled"] is True and config["kubelet"]["enabled"] is True
    assert config["mps"]["client_group"] == shipped["mps"]["client_group"]


def script_lines(path: Path) -> Iterator[str]:
    yield from path.read_text().splitlines()


@pytest.mark.parametrize("script", ["up.sh", "down.sh"])
def test_the_kind_scripts_are_sound_bash(script: str) -> None:
    path = KIND / script
    lines = list(script_lines(path))
    assert lines[0] == "#!/usr/bin/env bash" and "set -euo pipefail" in lines
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck"):
        done = subprocess.run(
            ["shellcheck", str(path)], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout


def test_up_sh_deploys_every_part_and_leaves_out_only_what_it_replaces() -> None:
    up = (KIND / "up.sh").read_text()
    for tool in ("docker", "kind", "kubectl", "openssl"):
        assert tool in re.search(r"for tool in ([^;]+);", up)[1]  # type: ignore[index]
    # the build command of daemonset/Dockerfile, and the image loaded into the nodes
    assert 'docker build -f "$REPO/daemonset/Dockerfile" -t "$AGENT_IMAGE" "$REPO"' in up
    assert 'kind load docker-image "$AGENT_IMAGE"' in up
    applied = set(re.findall(r'-f "\$(?:REPO|HERE)/([\w/.-]+\.yaml)"', up))
    replaced = {
        "daemonset/configmap.yaml": "deploy/kind/agent-config.yaml",
        "daemonset/secret.yaml": "secrets made by up.sh",
        "daemonset/certificate.yaml": "secrets made by up.sh",
        "daemonset/mps-host.yaml": "a simulated node's agent runs its own daemons",
        "deploy/certificates.yaml": "secrets made by up.sh",
        "deploy/issuer.yaml": "secrets made by up.sh",
    }
    for path in [*REPO.glob("daemonset/*.yaml"), *DEPLOY.glob("*.yaml")]:
        name = str(path.relative_to(REPO))
        assert name in replaced or name in applied or name.removeprefix("deploy/") in applied, name
    assert '--patch-file "$HERE/agent-daemonset-patch.yaml"' in up
    assert "caBundle" in up and "example-pod.yaml" in up and "logs" in up
    assert "--insecure-agents" not in up and "insecure_loopback" not in up
