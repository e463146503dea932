"""The deployment files are checked by the tools their users run: systemd-analyze for the
unit, the Kubernetes schemas (kubernetes-validate, strict) for the manifests; and the
agent's systemd readiness notification is a real datagram on a real socket."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, short_dir, spawn_agent

MANIFESTS = sorted((REPO / "daemonset").glob("*.yaml"))
UNIT = REPO / "systemd" / "gpushare-agent.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart exists: point it at this environment's gpushare
    installed = Path(sys.executable).parent / "gpushare"
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/gpushare", str(installed)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    text = UNIT.read_text()
    for line in ("Type=notify", "StateDirectory=gpushare", "RuntimeDirectory=gpushare"):
        assert line in text


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_validates_against_the_kubernetes_schema(manifest: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_configmap_holds_a_config_the_agent_accepts(tmp_path: Path) -> None:
    document = yaml.safe_load((REPO / "daemonset" / "configmap.yaml").read_text())
    config = tmp_path / "config.yaml"
    config.write_text(document["data"]["config.yaml"])
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--config", str(config), "config", "show", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert '"token_file": "/etc/gpushare/secret/token"' in done.stdout


def test_the_daemonset_probes_and_mounts_what_the_agent_serves() -> None:
    daemonset = yaml.safe_load((REPO / "daemonset" / "daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    assert pod["hostPID"] is True
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    assert paths["run"] == "/run/gpushare" and paths["state"] == "/var/lib/gpushare"
    assert "limits" in agent["resources"] and "requests" in agent["resources"]


def test_the_agent_tells_systemd_it_is_ready_and_stopping(monkeypatch: pytest.MonkeyPatch) -> None:
    with short_dir() as root:
        address = str(root / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(address)
            sock.settimeout(30)
            monkeypatch.setenv("NOTIFY_SOCKET", address)
            agent = spawn_agent(root)
            try:
                ready = sock.recv(4096).decode()
                assert "READY=1" in ready and f"MAINPID={agent.pid}" in ready
                agent.send_signal(signal.SIGTERM)
                assert "STOPPING=1" in sock.recv(4096).decode()
                assert agent.wait(timeout=30) == 0
            finally:
                if agent.poll() is None:
                    agent.kill()


def test_the_mps_daemons_run_apart_from_the_agent_and_are_never_rolled() -> None:
    """An agent rolling update must not restart a daemon: they live in their own DaemonSet
    (OnDelete), on the same host directory, in the host PID namespace the agent sees."""
    host = yaml.safe_load((REPO / "daemonset" / "mps-host.yaml").read_text())
    agent = yaml.safe_load((REPO / "daemonset" / "daemonset.yaml").read_text())
    assert host["spec"]["updateStrategy"] == {"type": "OnDelete"}
    pods = [d["spec"]["template"]["spec"] for d in (host, agent)]
    assert all(pod["hostPID"] is True for pod in pods)
    assert pods[0]["containers"][0]["args"][-2:] == ["mps", "host"]
    runs = [next(v for v in pod["volumes"] if v["name"] == "run")["hostPath"] for pod in pods]
    assert runs[0] == runs[1]
    assert pods[0]["containers"][0]["image"] == pods[1]["containers"][0]["image"]
    configmap = yaml.safe_load((REPO / "daemonset" / "configmap.yaml").read_text())
    assert yaml.safe_load(configmap["data"]["config.yaml"])["mps"]["launch"] == "host"


def test_the_image_takes_the_mps_binaries_from_the_host_driver() -> None:
    dockerfile = (REPO / "daemonset" / "Dockerfile").read_text()
    assert "nvidia-cuda-mps" not in dockerfile.split("FROM", 1)[1]
    assert "://" not in dockerfile  # no archive host: the base image's own sources


def test_a_systemd_restart_leaves_the_daemons_and_their_pipes() -> None:
    text = UNIT.read_text()
    assert "KillMode=process" in text.splitlines()
    assert "RuntimeDirectoryPreserve=yes" in text.splitlines()
