"""The agent's pod as the chart renders each path (daemonset/configmap.yaml and
daemonset.yaml: extender; deploy/dra/agent-config.yaml and the DRA patch: DRA), every host
path moved under a temporary root, and what an on-call engineer does in it: run
`gpushare doctor`, start an earlier release's MPS daemon, take a mount away."""

from __future__ import annotations

import grp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.mps.daemon import lock_holder
from tests.certs import make_pki
from tests.e2e.doctor_chart.cluster import NODE, TOKEN, USER, Cluster
from tests.helpers import REPO, agent_command, subprocess_env

FAKE_CONTROL = Path(sys.executable).parent / "gpushare-fake-mps-control"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CONFIGS = {
    "extender": REPO / "daemonset" / "configmap.yaml",
    "dra": REPO / "deploy" / "dra" / "agent-config.yaml",
}
SHARED_SHM = "/run/gpushare-shm"  # the chart's shm.hostPath: kubelet.shm_dir, dra.shm_dir
MANIFESTS = {
    "extender": (REPO / "daemonset" / "daemonset.yaml",),
    "dra": (
        REPO / "daemonset" / "daemonset.yaml",
        REPO / "deploy" / "dra" / "daemonset-patch.yaml",
    ),
}


def pod_mounts(path: str) -> dict[str, tuple[str, str]]:
    """The host directories the agent's container sees on ``path``, as the plain manifests
    render it (daemonset.yaml, with the DRA patch on that path): mountPath -> (host path,
    mountPropagation)."""
    volumes: dict[str, str] = {}
    mounts: dict[str, tuple[str, str]] = {}
    for manifest in MANIFESTS[path]:
        spec = yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]
        for volume in spec.get("volumes") or []:
            if "hostPath" in volume:
                volumes[volume["name"]] = volume["hostPath"]["path"]
        (agent,) = [c for c in spec["containers"] if c["name"] == "agent"]
        for mount in agent.get("volumeMounts") or []:
            mounts[mount["mountPath"]] = (mount["name"], mount.get("mountPropagation", "None"))
    return {
        point: (volumes[name], propagation)
        for point, (name, propagation) in mounts.items()
        if name in volumes
    }


def mount_of(mounts: dict[str, tuple[str, str]], path: str) -> str:
    """The mount point under which ``path`` lies ("" none)."""
    points = [p for p in mounts if path == p or path.startswith(p.rstrip("/") + "/")]
    return max(points, key=len, default="")


def rebased(value: Any, root: Path) -> Any:
    """Every absolute path of a configuration moved under ``root``."""
    if isinstance(value, dict):
        return {k: rebased(v, root) for k, v in value.items()}
    if isinstance(value, str) and value.startswith("/"):
        return f"{root}{value}"
    return value


def chart_config(path: str, root: Path, api_url: str) -> dict[str, Any]:
    """The rendered config.yaml of ``path``, its host paths under ``root``."""
    rendered = yaml.safe_load(CONFIGS[path].read_text())
    config: dict[str, Any] = rebased(yaml.safe_load(rendered["data"]["config.yaml"]), root)
    pki = make_pki(root / "pki")
    # no TCP listeners here (the doctor asks the socket); the TLS files are checked
    config["api"].update(
        tcp_listen="",
        http_listen="",
        tls_cert_file=str(pki.server_cert),
        tls_key_file=str(pki.server_key),
        tls_client_ca_file=str(pki.ca),
    )
    config["mps"].update(
        client_group=grp.getgrgid(os.getgid()).gr_name,  # the image's gpushare group
        control_binary=str(FAKE_CONTROL),  # the NVIDIA runtime mounts the driver's
        start_timeout_s=1,  # no mps-host pod starts the daemons the agent waits for
    )
    config["runtime"].update(node_name=NODE, log_format="text", shutdown_grace_s=5)
    if config.get("dra", {}).get("enabled"):
        (root / "token").write_text(TOKEN + "\n")
        config["dra"].update(api_server=api_url, api_token_file=str(root / "token"))
    return config


@dataclass
class Node:
    path: str
    root: Path
    config: dict[str, Any]
    cluster: Cluster | None

    @property
    def socket(self) -> Path:
        return self.root / "agent.sock"

    @property
    def shared_shm(self) -> Path:
        return Path(f"{self.root}{SHARED_SHM}")

    @property
    def shm_root(self) -> Path:
        return Path(self.config["mps"]["shm_root"])

    def devices(self) -> list[Path]:
        return sorted(Path(self.config["paths"]["runtime_dir"], "mps").glob("GPU-*"))

    def doctor(self, *args: str, config: bool = False) -> tuple[int, dict[str, tuple[str, str]]]:
        """`gpushare doctor` as typed in the agent's pod: (exit code, check -> line); with
        ``config``, as the chart's NOTES.txt types it (`gpushare --config FILE doctor`:
        the settings of the agent's config file rather than of the running agent)."""
        first = ("--config", str(self.root / "config.yaml")) if config else ()
        env = subprocess_env()
        for name in ("GPUSHARE_CONFIG", "GPUSHARE_SOCKET", "GPUSHARE_KUBE_API_SERVER"):
            env.pop(name, None)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        if self.path == "dra" or not os.path.exists(SERVICE_ACCOUNT_TOKEN):
            env["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"  # a pod's (no token: extender)
        done = subprocess.run(
            agent_command(*first, "--socket", str(self.socket), "doctor", *args),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "Traceback" not in done.stderr, done.stderr
        lines = {}
        for text in done.stdout.splitlines():
            status, check, rest = text.split(None, 2)
            lines[check] = (status, rest)
        return done.returncode, lines


@contextmanager
def earlier_daemon(device: Path) -> Iterator[int]:
    """The control daemon of ``device`` as an earlier release's MPS host left it: running,
    holding its pipe directory's lock, with no record of its shared memory. Its PID."""
    env = {
        **subprocess_env(),
        "CUDA_MPS_PIPE_DIRECTORY": str(device / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(device / "log"),
    }
    daemon = subprocess.Popen(
        [str(FAKE_CONTROL), "-f"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while not (pid := lock_holder(str(device / "pipe"))):
            assert daemon.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        yield pid
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=10)
        (device / "shm.json").unlink(missing_ok=True)


@contextmanager
def moved_away(path: Path) -> Iterator[None]:
    """``path`` not in the pod (not mounted) for the time of the block."""
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    try:
        yield
    finally:
        aside.rename(path)


def shm_key(node: Node) -> str:
    return "kubelet.shm_dir" if node.path == "extender" else "dra.shm_dir"


def assert_runtime_class_not_checked(node: Node, found: tuple[str, str]) -> None:
    """A role that grants no RuntimeClass read (the agent itself never reads one): a
    warning naming the rule, never a failure."""
    assert node.cluster is not None
    assert found[0] == "warn"
    assert found[1].startswith(
        f"RuntimeClass nvidia not read from {node.cluster.url}: 403 Forbidden: "
        f'runtimeclasses.node.k8s.io "nvidia" is forbidden: User "{USER}"'
    )
    assert "fix: check it: `kubectl get runtimeclass nvidia`" in found[1]
    assert "apiGroups [node.k8s.io], resources [runtimeclasses], verbs [get]" in found[1]
