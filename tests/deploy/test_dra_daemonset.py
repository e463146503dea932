"""The DRA driver's DaemonSet patch (deploy/dra/daemonset-patch.yaml) against the shipped
DaemonSet, the kubelet's paths and the agent's settings, and its configuration
(deploy/dra/agent-config.yaml) against the shipped one and the agent's defaults."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.config.loading import env_name, load_settings, setting_fields
from agent.dra.port import DRIVER_NAME
from agent.kubeapi.connection import SERVICE_ACCOUNT
from tests.deploy.dra_manifests import (
    DAEMONSET,
    DRA,
    DRA_DEFAULTS,
    DRA_KEYS,
    KIND,
    PATCH,
    SHM_DIR,
    agent_config,
    agent_container,
    assert_mounts_the_dra_dirs,
    by_key,
    config_text,
    dra_daemonset,
    kind_dra_daemonset,
    shipped_daemonset,
)
from tests.deploy.kube_manifests import find

# -- the DaemonSet ---------------------------------------------------------------------------


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
