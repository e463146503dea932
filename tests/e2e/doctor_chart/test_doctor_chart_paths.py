"""`gpushare doctor` as an on-call engineer runs it in the agent's pod, on a simulated node
configured as the chart renders each path's agent configuration (daemonset/configmap.yaml:
extender; deploy/dra/agent-config.yaml: DRA), every host path moved under a temporary
root: the pod mounts what the doctor reads, and the doctor is green (exit 0) on a correct
install of each path.

The pod is played by what the agent's DaemonSet mounts (the directories made under the
root), ``KUBERNETES_SERVICE_HOST`` (set in every pod) and, on the DRA path, the API
stand-in behind an RBAC stand-in that grants the ClusterRole of deploy/dra/rbac.yaml. What
cannot be had here: the in-cluster client's fixed token path and TLS (dra.api_server names
the stand-in, dra.api_token_file the token the chart projects), the mps-host pod (a
daemon of an earlier release is the fake control daemon, started by the test) and the
driver's binaries (mps.control_binary: the bundled fake). The node is conftest.py's; the
broken installs are in test_doctor_chart_shm.py and test_doctor_chart_dra_role.py."""

from __future__ import annotations

import os

import pytest
import yaml

from agent.config import load_settings
from tests.e2e.doctor_chart.chart import (
    CONFIGS,
    SERVICE_ACCOUNT_TOKEN,
    Node,
    assert_runtime_class_not_checked,
    mount_of,
    pod_mounts,
)
from tests.e2e.doctor_chart.cluster import NODE

# -- what the chart must give the agent's pod ----------------------------------------------------


@pytest.mark.parametrize("path", ["extender", "dra"])
def test_the_agent_pod_mounts_what_the_doctor_reads(path: str) -> None:
    """Each host directory the doctor reads on ``path`` is mounted in the agent's pod at
    its own path, and the tmpfs mounts the mps-host pod makes under mps.shm_root reach it
    (propagation): else the doctor, run there, fails on a correct install."""
    rendered = yaml.safe_load(CONFIGS[path].read_text())["data"]["config.yaml"]
    settings = load_settings(rendered, env={}, source=str(CONFIGS[path]))
    k, d = settings.kubelet, settings.dra
    read = {"mps.root_dir": settings.mps_root_dir, "mps.shm_root": settings.mps.shm_root}
    if k.enabled:
        read.update({"kubelet.plugin_dir": k.plugin_dir, "kubelet.shm_dir": k.shm_dir})
    if d.enabled:
        read.update(
            {
                "dra.plugin_dir": d.plugin_dir,
                "dra.registry_dir": d.registry_dir,
                "dra.cdi_dir": d.cdi_dir,
                "dra.shm_dir": d.shm_dir,
            }
        )
    mounts = pod_mounts(path)
    for key, directory in read.items():
        point = mount_of(mounts, directory)
        assert point, f"{key} {directory} is not mounted in the agent's pod ({path})"
        assert mounts[point][0] == point, f"{key}: {point} is not the host's {point}"
    propagation = mounts[mount_of(mounts, settings.mps.shm_root)][1]
    assert propagation in ("Bidirectional", "HostToContainer")


# -- green on a correct install -----------------------------------------------------------------


def test_a_correct_install_is_green(node: Node) -> None:
    code, lines = node.doctor()
    assert code == 0, lines
    as_noted, noted = node.doctor(config=True)
    assert as_noted == 0, noted
    assert {c: s for c, (s, _) in noted.items()} == {c: s for c, (s, _) in lines.items()}
    failed = {check: rest for check, (status, rest) in lines.items() if status == "fail"}
    assert not failed
    status = {check: s for check, (s, _) in lines.items()}
    assert status["mps-binary"] == status["mps-pipes"] == status["agent"] == "ok"
    assert lines["mps-shm"] == (
        "ok",
        f"no MPS daemon runs yet; each will have a tmpfs under {node.shm_root}",
    )
    assert status["nvidia-toolkit"] == "skip"  # a simulated node has no driver to give
    if node.path == "extender":
        assert status["kubelet-plugin-dir"] == "ok"
        assert status["dra-plugin-dir"] == status["dra-registry-dir"] == status["cdi-dir"]
        assert status["cdi-dir"] == "skip"
        if not os.path.exists(SERVICE_ACCOUNT_TOKEN):
            for check in ("node-label", "runtime-class", "nvidia-device-plugin"):
                assert lines[check][0] == "skip"
                assert (
                    "this pod has no service-account token: on the extender path the "
                    in (lines[check][1])
                )
        return
    assert status["kubelet-plugin-dir"] == "skip"
    assert status["dra-plugin-dir"] == status["dra-registry-dir"] == status["cdi-dir"] == "ok"
    assert lines["node-label"] == ("ok", f"node {NODE} has nvidia.com/gpu.present=true")
    assert lines["nvidia-device-plugin"][0] == "ok"
    assert node.cluster is not None
    if node.cluster.role.allows("node.k8s.io", "runtimeclasses", "get"):
        assert lines["runtime-class"] == ("ok", "RuntimeClass nvidia exists")
    else:
        assert_runtime_class_not_checked(node, lines["runtime-class"])
