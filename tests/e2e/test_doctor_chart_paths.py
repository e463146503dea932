"""`gpushare doctor` as an on-call engineer runs it in the agent's pod, on a simulated node
configured as the chart renders each path's agent configuration (daemonset/configmap.yaml:
extender; deploy/dra/agent-config.yaml: DRA), every host path moved under a temporary
root: green (exit 0) on a correct install of each path, red naming the fix on each broken
install of issue 39 (the shm directory the doctor checks not mounted in the agent's pod,
or the per-device tmpfs not seen there; the RuntimeClass and the Node behind the DRA
role as the chart renders it).

The pod is played by what the agent's DaemonSet mounts (the directories made under the
root), ``KUBERNETES_SERVICE_HOST`` (set in every pod) and, on the DRA path, the API
stand-in behind an RBAC stand-in that grants the ClusterRole of deploy/dra/rbac.yaml. What
cannot be had here: the in-cluster client's fixed token path and TLS (dra.api_server names
the stand-in, dra.api_token_file the token the chart projects), the mps-host pod (a
daemon of an earlier release is the fake control daemon, started by the test) and the
driver's binaries (mps.control_binary: the bundled fake)."""

from __future__ import annotations

import asyncio
import base64
import grp
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from agent.config import load_settings
from agent.mps.daemon import lock_holder
from tests.certs import make_pki
from tests.helpers import REPO, agent_command, short_dir, subprocess_env
from tests.kube.apiserver import ApiError, FakeApiServer

NODE = "worker-1"
USER = "system:serviceaccount:gpushare-system:gpushare-agent"
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


def service_account_token() -> str:
    """A token shaped as a service account's (a JWT naming its user); unsigned."""

    def part(value: dict[str, str]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part({'sub': USER})}.x"


TOKEN = service_account_token()


# -- the API stand-in behind the DRA role ------------------------------------------------------


@dataclass
class Role:
    """The ClusterRole bound to the agent's service account: (groups, resources, verbs)."""

    rules: list[tuple[frozenset[str], frozenset[str], frozenset[str]]]

    @classmethod
    def shipped(cls) -> Role:
        """deploy/dra/rbac.yaml's ClusterRole, as the chart renders it."""
        docs = yaml.safe_load_all((REPO / "deploy" / "dra" / "rbac.yaml").read_text())
        (role,) = [d for d in docs if d and d["kind"] == "ClusterRole"]
        return cls(
            [
                (frozenset(r["apiGroups"]), frozenset(r["resources"]), frozenset(r["verbs"]))
                for r in role["rules"]
            ]
        )

    def allows(self, group: str, resource: str, verb: str) -> bool:
        return any(group in g and resource in r and verb in v for g, r, v in self.rules)

    def granting(self, group: str, resource: str, verb: str) -> Role:
        rule = (frozenset({group}), frozenset({resource}), frozenset({verb}))
        return Role([*self.rules, rule])

    def without(self, group: str, resource: str) -> Role:
        return Role([(g, r - {resource} if group in g else r, v) for g, r, v in self.rules])


def attributes(request: web.Request) -> tuple[str, str, str, str]:
    """(API group, resource, verb, name) of a request, as the API server authorizes it."""
    parts = request.path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else ""
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if request.method in verbs:
        return group, resource, verbs[request.method], name
    if request.method == "DELETE":
        return group, resource, "delete" if name else "deletecollection", name
    watch = request.query.get("watch") in ("1", "true")
    return group, resource, "get" if name else "watch" if watch else "list", name


@dataclass
class Cluster:
    """The API stand-in on a thread of its own (the doctor and the agent are processes the
    tests wait on): the node, the RuntimeClasses, and the role its token is granted."""

    role: Role = field(default_factory=Role.shipped)
    runtime_classes: set[str] = field(default_factory=lambda: {"nvidia"})
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _failure: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="api-stand-in", daemon=True)
        self._thread.start()
        assert self._ready.wait(30) and self._failure is None, self._failure

    def stop(self) -> None:
        assert self._loop is not None and self._stop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert self._failure is None, self._failure

    @contextmanager
    def granted(self, role: Role) -> Iterator[None]:
        shipped, self.role = self.role, role
        try:
            yield
        finally:
            self.role = shipped

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start() or stop()
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        api = FakeApiServer(token=TOKEN)
        api.app.middlewares.append(self._authorize)
        api.app.router.add_get("/apis/node.k8s.io/v1/runtimeclasses/{name}", self._runtime_class)
        async with api:
            api.create_node(NODE, labels={"nvidia.com/gpu.present": "true"})
            self.url = api.url
            self._ready.set()
            await self._stop.wait()

    @web.middleware
    async def _authorize(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        group, resource, verb, name = attributes(request)
        if self.role.allows(group, resource, verb):
            response: web.StreamResponse = await handler(request)
            return response
        qualified = f"{resource}.{group}" if group else resource
        message = (
            f'{qualified} "{name}" is forbidden: User "{USER}" cannot {verb} resource '
            f'"{resource}" in API group "{group}" at the cluster scope'
        )
        return ApiError(403, message, "Forbidden").response()

    async def _runtime_class(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.runtime_classes:
            message = f'runtimeclasses.node.k8s.io "{name}" not found'
            return ApiError(404, message, "NotFound").response()
        return web.json_response(
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "nvidia"}
        )


# -- the node ----------------------------------------------------------------------------------


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


def _log(root: Path) -> str:
    path = root / "agent.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module", params=["extender", "dra"])
def node(request: pytest.FixtureRequest) -> Iterator[Node]:
    """`gpushare serve --sim` with ``path``'s chart configuration, in a pod of the chart."""
    path: str = request.param
    cluster = Cluster() if path == "dra" else None
    with short_dir() as root, running(cluster):
        config = chart_config(path, root, cluster.url if cluster else "")
        (root / "config.yaml").write_text(yaml.safe_dump(config))
        for point in pod_mounts(path):  # what the pod sees of the host
            Path(f"{root}{point}").mkdir(parents=True, exist_ok=True)
        if os.path.isdir(f"{root}{SHARED_SHM}"):  # as the mps-host pod's clients need it
            os.chmod(f"{root}{SHARED_SHM}", 0o1777)
        shm_root = Path(config["mps"]["shm_root"])  # the mps-host pod makes it 0700
        shm_root.mkdir(mode=0o700, parents=True)
        command = agent_command(
            "--config", str(root / "config.yaml"), "--socket", str(root / "agent.sock"), "serve"
        )
        with open(root / "agent.log", "ab") as log:
            agent = subprocess.Popen(
                [*command, "--sim"], env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=log
            )
        try:
            deadline = time.monotonic() + 30
            while "agent ready" not in _log(root):
                assert agent.poll() is None and time.monotonic() < deadline, _log(root)[-3000:]
                time.sleep(0.1)
            yield Node(path, root, config, cluster)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)


@contextmanager
def running(cluster: Cluster | None) -> Iterator[None]:
    if cluster is None:
        yield
        return
    cluster.start()
    try:
        yield
    finally:
        cluster.stop()


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


def test_a_daemon_of_an_earlier_release_is_a_warning(node: Node) -> None:
    device = node.devices()[0]
    with earlier_daemon(device) as pid:
        code, lines = node.doctor()
    assert code == 0, lines
    status, rest = lines["mps-shm"]
    assert status == "warn"
    assert rest.startswith(f"{device.name}: daemon {pid} has no record of its shared memory")
    assert f"the containers of these devices share {node.shared_shm}" in rest


DRA_ONLY = pytest.mark.parametrize("node", ["dra"], indirect=True)  # the only path with an API


# -- red, naming the fix, on a broken one -------------------------------------------------------


def test_the_shared_shm_directory_not_mounted_in_the_pod(node: Node) -> None:
    device = node.devices()[0]
    with moved_away(node.shared_shm):
        code, lines = node.doctor()
        assert code == 0 and lines["mps-shm"][0] == "ok"  # no daemon uses it: not checked
        with earlier_daemon(device):
            code, lines = node.doctor()
        assert code == 1
        status, rest = lines["mps-shm"]
        assert status == "fail"
        assert f"{node.shared_shm} is not in this pod ({shm_key(node)})" in rest
        assert (
            f"fix: mount the host's {node.shared_shm} into the agent's pod at the same path "
            "(hostPath, read-only will do: the chart's shm.hostPath" in rest
        )
        # shm.size "": no tmpfs per device, every container gets the shared directory
        code, lines = node.doctor("--set", "mps.shm_root=")
        assert code == 1 and lines["mps-shm"][0] == "fail"
        assert (
            f"fix: mount the host's {node.shared_shm} into the agent's pod" in (lines["mps-shm"][1])
        )
    code, lines = node.doctor("--set", "mps.shm_root=")
    assert code == 0 and lines["mps-shm"][0] == "warn"
    assert "one /dev/shm for every tenant of the node" in lines["mps-shm"][1]


def test_the_shared_shm_directory_closed_to_the_clients(node: Node) -> None:
    os.chmod(node.shared_shm, 0o755)
    try:
        code, lines = node.doctor("--set", "mps.shm_root=")
    finally:
        os.chmod(node.shared_shm, 0o1777)
    assert code == 1
    assert lines["mps-shm"][0] == "fail"
    assert "MPS clients of other users cannot create their segments in it" in lines["mps-shm"][1]
    assert f"fix: chmod 1777 {node.shared_shm} (on the host)" in lines["mps-shm"][1]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_the_device_tmpfs_not_seen_in_the_pod(node: Node) -> None:
    """The mps-host pod gave the daemon its tmpfs, but the agent's pod does not see it
    there (its run volume without Bidirectional or HostToContainer propagation): what
    the doctor sees at <shm_root>/<uuid> is the empty directory under the mount."""
    device = node.devices()[0]
    directory = node.shm_root / device.name
    directory.mkdir()
    try:
        with earlier_daemon(device) as pid:
            record = {"pid": pid, "start": None, "dir": str(directory), "reason": ""}
            (device / "shm.json").write_text(json.dumps(record))
            code, lines = node.doctor()
    finally:
        directory.rmdir()
    assert code == 1
    status, rest = lines["mps-shm"]
    assert status == "fail"
    assert f"{device.name}: daemon {pid} should have {directory} at /dev/shm but has not" in rest
    assert (
        f"fix: mount the host directory that holds {node.shm_root} into the agent's pod with "
        "mountPropagation Bidirectional (or HostToContainer)" in rest
    )


@DRA_ONLY
def test_dra_a_missing_runtime_class(node: Node) -> None:
    assert node.cluster is not None
    readable = node.cluster.role.granting("node.k8s.io", "runtimeclasses", "get")
    node.cluster.runtime_classes.discard("nvidia")
    try:
        with node.cluster.granted(readable):
            code, lines = node.doctor()
    finally:
        node.cluster.runtime_classes.add("nvidia")
    assert code == 1
    assert lines["runtime-class"] == (
        "fail",
        "no RuntimeClass nvidia: the agent's and the workloads' pods run under it  fix: install "
        "the NVIDIA container toolkit with the GPU Operator (it creates it), or create a "
        "RuntimeClass nvidia with handler nvidia",
    )


@DRA_ONLY
def test_dra_a_role_that_may_not_read_runtime_classes(node: Node) -> None:
    assert node.cluster is not None
    with node.cluster.granted(node.cluster.role.without("node.k8s.io", "runtimeclasses")):
        code, lines = node.doctor()
    assert code == 0, lines
    assert_runtime_class_not_checked(node, lines["runtime-class"])


@DRA_ONLY
def test_dra_a_role_that_may_not_read_the_node(node: Node) -> None:
    assert node.cluster is not None
    with node.cluster.granted(node.cluster.role.without("", "nodes")):
        code, lines = node.doctor()
    assert code == 1
    for check in ("node-label", "nvidia-device-plugin"):
        status, rest = lines[check]
        assert status == "fail"
        assert rest.startswith(f"node {NODE} not read from {node.cluster.url}: 403 Forbidden")
        assert (
            f"fix: the token of dra.api_token_file {node.root}/token must get nodes, as the DRA "
            "driver reads its Node: bind it the chart's ClusterRole gpushare-dra-driver" in rest
        )
        assert f"`kubectl auth can-i get nodes --as={USER}`" in rest
