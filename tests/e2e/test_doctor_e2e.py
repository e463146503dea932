"""`gpushare doctor` as a real process against `gpushare serve --sim`: every check's line on
the simulated node, then one prerequisite broken at a time, each seen failing with its fix."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certs import Pki, make_pki
from tests.helpers import agent_command, short_dir, spawn_agent, subprocess_env
from tests.kubeworld.apiserver import FakeApiServer
from tests.unit.cli.test_doctor_certificates import openssl_ca

CHECKS = [
    "mps-binary",
    "driver-release",
    "node-label",
    "runtime-class",
    "nvidia-device-plugin",
    "mps-pipes",
    "mps-shm",
    "nvidia-toolkit",
    "kubelet-plugin-dir",
    "dra-plugin-dir",
    "dra-registry-dir",
    "cdi-dir",
    "cert:api.tls_cert_file",
    "cert:api.tls_client_ca_file",
    "cert:api.tls_key_file",
    "agent",
]


class Node:
    def __init__(self, root: Path, pki: Pki) -> None:
        self.root = root
        self.pki = pki

    @property
    def socket(self) -> Path:
        return self.root / "agent.sock"


def env() -> dict[str, str]:
    values = subprocess_env()
    for name in ("GPUSHARE_CONFIG", "GPUSHARE_SOCKET", "KUBERNETES_SERVICE_HOST"):
        values.pop(name, None)
    values.pop("GPUSHARE_KUBE_API_SERVER", None)
    return values


def parse(stdout: str) -> dict[str, tuple[str, str]]:
    """check -> (status, the rest of its line)."""
    found = {}
    for text in stdout.splitlines():
        status, check, rest = text.split(None, 2)
        found[check] = (status, rest)
    return found


def doctor(socket: Path, *args: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    done = subprocess.run(
        agent_command("--socket", str(socket), "doctor", *args),
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, parse(done.stdout), done.stderr


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with short_dir() as root:
        pki = make_pki(root / "pki")
        agent = spawn_agent(
            root,
            "--set", "runtime.on_stop=quit",
            "--set", "runtime.node_name=worker-1",
            "--set", f"mps.client_gid={os.getgid()}",
            # the agent puts a pipe directory's mode back at its next probe: not during a test
            "--set", "mps.probe_interval_s=3600",
            "--set", f"api.tls_cert_file={pki.server_cert}",
            "--set", f"api.tls_key_file={pki.server_key}",
            "--set", f"api.tls_client_ca_file={pki.ca}",
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while "agent ready" not in _log(root):
                assert agent.poll() is None and time.monotonic() < deadline, _log(root)
                time.sleep(0.1)
            yield Node(root, pki)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=20)


def _log(root: Path) -> str:
    path = root / "agent.log"
    return path.read_text() if path.exists() else ""


def test_every_check_on_the_simulated_node(node: Node) -> None:
    code, lines, stderr = doctor(node.socket)
    assert code == 0, lines
    assert list(lines) == CHECKS
    assert "checking the running agent's settings (pid" in stderr
    status = {check: s for check, (s, _) in lines.items()}
    assert status == {
        "mps-binary": "ok",
        "driver-release": "skip",
        "node-label": "skip",
        "runtime-class": "skip",
        "nvidia-device-plugin": "skip",
        "mps-pipes": "ok",
        "mps-shm": "skip",
        "nvidia-toolkit": "skip",
        "kubelet-plugin-dir": "skip",
        "dra-plugin-dir": "skip",
        "dra-registry-dir": "skip",
        "cdi-dir": "skip",
        "cert:api.tls_cert_file": "warn",  # the test CA's certificates live 2 days
        "cert:api.tls_client_ca_file": "warn",
        "cert:api.tls_key_file": "ok",
        "agent": "ok",
    }
    assert lines["driver-release"][1].startswith("simulated node: no NVIDIA driver to ask")
    assert lines["node-label"][1] == (
        "skipped: no API (not in a cluster, and neither --api-server nor dra.api_server is set)"
    )
    assert lines["mps-pipes"][1] == (
        f"4 device(s) under {node.root}/mps: pipe and log 0750 uid {os.geteuid()} gid {os.getgid()}"
    )
    assert lines["mps-shm"][1].startswith("no Kubernetes path")
    assert lines["cdi-dir"][1] == "dra.enabled is off"
    assert lines["cert:api.tls_cert_file"][1].startswith(f"{node.pki.server_cert} expires in 2")
    assert "fix: renew" in lines["cert:api.tls_cert_file"][1]
    assert lines["agent"][1].startswith(
        f"answers on {node.socket}: node worker-1 (simulated node), 4 device(s), agent "
    )


def test_a_wrong_mode_on_a_pipe_directory(node: Node) -> None:
    pipe = sorted((node.root / "mps").glob("GPU-*/pipe"))[0]
    pipe.chmod(0o777)
    try:
        code, lines, _ = doctor(node.socket)
    finally:
        pipe.chmod(0o750)
    assert code == 1
    status, rest = lines["mps-pipes"]
    assert status == "fail"
    assert f"{pipe} is 0777 uid {os.geteuid()} gid {os.getgid()}, must be 0750" in rest
    assert f"fix: chown {os.geteuid()}:{os.getgid()} {pipe} && chmod 0750 {pipe}" in rest
    assert doctor(node.socket)[0] == 0


def test_a_missing_cdi_directory_with_dra(node: Node) -> None:
    for name in ("plugins", "registry"):
        (node.root / name).mkdir(exist_ok=True)
    dra = [
        "--set", "dra.enabled=true",
        "--set", f"dra.plugin_dir={node.root}/plugins",
        "--set", f"dra.registry_dir={node.root}/registry",
        "--set", f"dra.cdi_dir={node.root}/cdi",
    ]  # fmt: skip
    code, lines, stderr = doctor(node.socket, *dra)
    assert "checking the running agent's settings with --set" in stderr
    assert code == 1
    assert lines["cdi-dir"] == (
        "fail",
        f"{node.root}/cdi (dra.cdi_dir) does not exist  fix: mount the host's {node.root}/cdi "
        "into the agent's pod (hostPath), or set dra.cdi_dir to where the kubelet and the "
        "container runtime look",
    )
    assert lines["dra-plugin-dir"][0] == lines["dra-registry-dir"][0] == "ok"
    assert lines["mps-shm"][0] == "warn" and "dra.shm_dir empty" in lines["mps-shm"][1]
    (node.root / "cdi").mkdir()
    code, lines, _ = doctor(node.socket, *dra)
    assert code == 0 and lines["cdi-dir"][0] == "ok"


def test_an_expired_certificate(node: Node) -> None:
    expired = openssl_ca(node.pki.root, "expired", "20200101000000Z", "20200201000000Z")
    code, lines, _ = doctor(node.socket, "--set", f"api.tls_cert_file={expired}")
    assert code == 1
    status, rest = lines["cert:api.tls_cert_file"]
    assert status == "fail"
    assert rest.startswith(f"{expired} expired on 2020-02-01 00:00 UTC  fix: renew {expired}")
    unreadable = node.root / "nope.crt"
    code, lines, _ = doctor(node.socket, "--set", f"api.tls_client_ca_file={unreadable}")
    assert code == 1
    assert lines["cert:api.tls_client_ca_file"][1].startswith(
        f"{unreadable}: cannot read it: No such file or directory  fix: mount the Secret"
    )


def test_no_agent() -> None:
    with short_dir() as root:
        code, lines, stderr = doctor(root / "agent.sock", "--set", f"paths.runtime_dir={root}")
    assert code == 1
    assert "no agent runs on" in stderr
    assert lines["agent"][0] == "fail"
    assert lines["agent"][1].startswith(f"no agent socket at {root}/agent.sock")
    assert "fix: start the agent" in lines["agent"][1]
    assert lines["mps-pipes"] == (
        "warn",
        f"{root}/mps does not exist yet (the agent makes it at start)",
    )


async def test_the_node_label_and_the_runtime_class_from_an_api_server(node: Node) -> None:
    token = node.root / "kube-token"
    token.write_text("t\n")
    async with FakeApiServer(token="t") as api:
        api.create_node("worker-1")
        process = await asyncio.create_subprocess_exec(
            *agent_command(
                "--socket", str(node.socket), "doctor",
                "--api-server", api.url, "--api-token-file", str(token),
            ),
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        stdout, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    lines = parse(stdout.decode())
    assert process.returncode == 1
    assert lines["node-label"] == (
        "fail",
        "node worker-1 has neither gpushare.io/node=true (the chart's node selector) nor "
        "nvidia.com/gpu.present=true (the plain manifests'): the agent's DaemonSets run on the "
        "nodes so labelled  fix: `kubectl label node worker-1 gpushare.io/node=true` (the "
        "chart's default nodeSelector), or give the chart another nodeSelector",
    )
    assert lines["runtime-class"][0] == "fail"
    assert lines["runtime-class"][1].startswith("no RuntimeClass nvidia")
    assert lines["nvidia-device-plugin"] == ("ok", "node worker-1 offers no nvidia.com/gpu")


def test_a_config_file_named_on_the_command_line_wins(node: Node) -> None:
    config = node.root / "kubelet.yaml"
    config.write_text(
        f"version: 1\npaths:\n  runtime_dir: {node.root}\n"
        f"kubelet:\n  enabled: true\n  plugin_dir: {node.root}/device-plugins\n"
    )
    done = subprocess.run(
        agent_command("--config", str(config), "--socket", str(node.socket), "doctor"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = parse(done.stdout)
    assert done.returncode == 1
    assert "checking the settings of --config" in done.stderr
    assert lines["kubelet-plugin-dir"][0] == "fail"
    assert lines["kubelet-plugin-dir"][1].startswith(
        f"{node.root}/device-plugins (kubelet.plugin_dir) does not exist"
    )
    assert lines["agent"][0] == "ok"
