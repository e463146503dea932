"""The Helm chart deploy/helm/gpushare: it lints, renders for each Kubernetes path and each
certificate option, and every object it renders validates against the Kubernetes schemas
of the versions the path runs on (1.30 for the extender path, 1.34 to 1.37 where the DRA
driver is installed); its values reach the manifests; each device's MPS server gets a
tmpfs of its own that the mps-host pod makes where the host and the agent see it; the
plain manifests under daemonset/ and deploy/ are its output (deploy/render.sh) and do not
drift from it.

Helm itself renders here: the package helm-python-sdk (a dev dependency) binds Helm's Go
code, so no helm binary and no network are needed."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from agent.config.loading import load_settings
from tests.helpers import REPO

CHART = REPO / "deploy" / "helm" / "gpushare"
EXTENDER_VERSIONS = ("1.30.0",)
DRA_VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
PATHS = ("extender", "dra", "both")
# certificates.* of each option the chart offers.
CERTIFICATES: dict[str, dict[str, Any]] = {
    "issuer-created": {"mode": "certManager", "issuer": {"create": True, "kind": "Issuer"}},
    "clusterissuer-created": {
        "mode": "certManager",
        "issuer": {"create": True, "kind": "ClusterIssuer", "name": "gpushare-ca"},
    },
    "own-clusterissuer": {
        "mode": "certManager",
        "issuer": {"create": False, "kind": "ClusterIssuer", "name": "internal-ca"},
    },
    "existing-secrets": {
        "mode": "secrets",
        "secrets": {
            "agent": "a-tls",
            "schedulerClient": "s-tls",
            "draControllerClient": "d-tls",
            "webhook": "w-tls",
        },
        "webhookCABundle": "TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2c9PQ==",
    },
    # the chart's own CA (tests/deploy/test_generated_certificates.py)
    "generated": {"mode": "generated"},
}
CERT_MANAGER = "cert-manager.io/v1"
# The DRA path's own objects, (kind, name): none on the extender path (the run-as-user
# policies of each path: tests/deploy/test_run_as_user_policy.py).
DRA_OBJECTS = {
    ("DeviceClass", "gpushare.io"),
    ("ValidatingAdmissionPolicy", "gpushare-dra-own-node-slices"),
    ("ValidatingAdmissionPolicyBinding", "gpushare-dra-own-node-slices"),
}


def load_render_module() -> Any:
    spec = importlib.util.spec_from_file_location("gpushare_render", CHART.parent / "render.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RENDER = load_render_module()


# The cluster's version as Helm reads it at install: the chart's kube-scheduler follows it
# (an offline render with Helm's default version is refused: test_chart_defaults.py).
KUBE_VERSION = "v1.30.14"


def render(values: dict[str, Any] | None = None, namespace: str = "gpushare") -> dict[str, str]:
    return RENDER.render(  # type: ignore[no-any-return]
        values or {}, namespace=namespace, kube_version=KUBE_VERSION
    )


def objects(
    values: dict[str, Any] | None = None, namespace: str = "gpushare"
) -> list[dict[str, Any]]:
    docs = []
    for text in render(values, namespace).values():
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def pod_of(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return find(docs, kind, name)["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def agent_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    text = find(docs, "ConfigMap", "gpushare-agent-config")["data"]["config.yaml"]
    return yaml.safe_load(text)  # type: ignore[no-any-return]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


# -- lint, render, schemas ---------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_the_chart_lints_clean_for_each_path(path: str) -> None:
    # a cluster's version with its patch release: the kube-scheduler image follows it
    version = "v1.30.14" if path == "extender" else "v1.34.2"
    report = helm_python.lint(str(CHART), {"path": path}, strict=True, kube_version=version)
    assert report["errors"] == [], report
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [], problems


@pytest.mark.parametrize("certificates", CERTIFICATES)
@pytest.mark.parametrize("path", PATHS)
def test_every_rendered_object_validates_for_the_versions_of_its_path(
    path: str, certificates: str
) -> None:
    """Strict: no unknown field, every kind but cert-manager's has a schema in each version."""
    docs = objects({"path": path, "certificates": CERTIFICATES[certificates]})
    versions = EXTENDER_VERSIONS if path == "extender" else DRA_VERSIONS
    kinds, named = set(), set()
    for doc in docs:
        kinds.add(doc["kind"])
        named.add((doc["kind"], doc["metadata"]["name"]))
        if doc["apiVersion"] == CERT_MANAGER:
            continue  # a CRD: checked below
        for version in versions:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} on {version}: {error}")
    assert {"DaemonSet", "ConfigMap", "Service", "ServiceAccount", "NetworkPolicy"} <= kinds
    assert "Deployment" in kinds  # the scheduler's, the DRA controller's
    assert (named >= DRA_OBJECTS) == (path != "extender")
    assert not (DRA_OBJECTS & named) or path != "extender"


@pytest.mark.parametrize("certificates", CERTIFICATES)
@pytest.mark.parametrize("path", PATHS)
def test_each_certificate_option_makes_every_secret_the_pods_mount(
    path: str, certificates: str
) -> None:
    option = CERTIFICATES[certificates]
    docs = objects({"path": path, "certificates": option})
    certs = [d for d in docs if d["kind"] == "Certificate"]
    issuers = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"].endswith("Issuer")}
    made = {c["spec"]["secretName"] for c in certs} | {
        d["metadata"]["name"] for d in docs if d["kind"] == "Secret"
    }
    mounted = set()
    for d in docs:
        if d["kind"] in ("DaemonSet", "Deployment"):
            for volume in d["spec"]["template"]["spec"]["volumes"]:
                if "secret" in volume:
                    mounted.add(volume["secret"]["secretName"])
    if option["mode"] == "secrets":
        assert not certs and not issuers
        assert mounted - made == {s for s in option["secrets"].values() if s in mounted}
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            if path != "dra":
                configuration = find(docs, kind)
                assert "annotations" not in configuration["metadata"]
                for hook in configuration["webhooks"]:
                    assert hook["clientConfig"]["caBundle"] == option["webhookCABundle"]
        return
    assert mounted <= made, mounted - made
    issuer = option.get("issuer", {"create": False})
    for cert in certs:
        ref = cert["spec"]["issuerRef"]
        if cert["metadata"]["name"] == "gpushare-ca":
            assert cert["spec"]["isCA"] is True
            assert (ref["kind"], ref["name"]) == (issuer["kind"], "gpushare-selfsigned")
            continue
        assert (ref["kind"], ref["name"]) == (
            issuer["kind"],
            issuer.get("name", "gpushare-ca-issuer"),
        )
        if issuer["create"]:
            assert (ref["kind"], ref["name"]) in issuers  # shipped: not a dangling reference
    if issuer["create"]:
        ca_issuer = find(docs, issuer["kind"], issuer.get("name", "gpushare-ca-issuer"))
        ca_cert = find(docs, "Certificate", "gpushare-ca")
        assert ca_issuer["spec"] == {"ca": {"secretName": ca_cert["spec"]["secretName"]}}
        assert find(docs, issuer["kind"], "gpushare-selfsigned")["spec"] == {"selfSigned": {}}
        if issuer["kind"] == "ClusterIssuer":
            assert "namespace" not in ca_issuer["metadata"]
            assert ca_cert["metadata"]["namespace"] == "cert-manager"  # the cluster resource ns
        else:
            assert ca_issuer["metadata"]["namespace"] == ca_cert["metadata"]["namespace"]
    else:
        assert not issuers


def test_bad_values_are_refused_with_the_setting_named() -> None:
    for values, said in (
        ({"path": "device-plugin"}, "path"),
        ({"certificates": {"mode": "vault"}}, "certificates.mode"),
        ({"certificates": {"issuer": {"kind": "Vault"}}}, "certificates.issuer.kind"),
        ({"certificates": {"mode": "secrets"}}, "webhookCABundle"),
    ):
        with pytest.raises(helm_python.HelmError, match=said):
            render(values)


# -- the values reach the manifests --------------------------------------------------------


def test_image_namespace_placement_runtime_group_and_versions_come_from_the_values() -> None:
    docs = objects(
        {
            "path": "both",
            "namespace": {"name": "gpu-infra", "create": True},
            "image": {"registry": "registry.example.com/team", "tag": "9.9.9"},
            "scheduler": {"version": "v1.33.2"},
            # a null drops a key (the earlier releases' way to replace their default)
            "nodeSelector": {"nvidia.com/gpu.present": None, "gpushare.io/node": "true"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
            "runtimeClassName": "nvidia-cdi",
            "mps": {"clientGroup": "mpsusers"},
            "agent": {"resources": {"limits": {"memory": "3Gi"}}},
        }
    )
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding", "Namespace", "DeviceClass"):
            if "WebhookConfiguration" in d["kind"] or "AdmissionPolicy" in d["kind"]:
                continue
            assert d["metadata"]["namespace"] in ("gpu-infra", "kube-system"), d["metadata"]
    assert find(docs, "Namespace")["metadata"]["name"] == "gpu-infra"
    for name in ("gpushare-agent", "gpushare-mps-host"):
        pod = pod_of(docs, "DaemonSet", name)
        assert pod["nodeSelector"] == {"gpushare.io/node": "true"}
        assert {"key": "dedicated", "operator": "Equal", "value": "gpu"} in pod["tolerations"]
        assert pod["runtimeClassName"] == "nvidia-cdi"
        for c in containers(pod):
            assert c["image"] == "registry.example.com/team/gpushare-agent:9.9.9"
    assert pod_of(docs, "DaemonSet", "gpushare-agent")["containers"][0]["resources"]["limits"] == {
        "cpu": "2",  # the default's, merged
        "memory": "3Gi",
    }
    scheduler = {
        c["name"]: c for c in pod_of(docs, "Deployment", "gpushare-scheduler")["containers"]
    }
    assert scheduler["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.33.2"
    assert scheduler["gpushare"]["image"] == "registry.example.com/team/gpushare-agent:9.9.9"
    assert "--agents-namespace=gpu-infra" in scheduler["gpushare"]["args"]
    assert agent_config(docs)["mps"]["client_group"] == "mpsusers"
    policy = find(docs, "ValidatingAdmissionPolicy", "gpushare-dra-own-node-slices")
    assert "system:serviceaccount:gpu-infra:gpushare-agent" in str(policy["spec"])


def test_a_digest_pins_the_image_and_the_default_is_the_opt_in_node_label() -> None:
    docs = objects({"image": {"digest": "sha256:" + "a" * 64}, "runtimeClassName": ""})
    pod = pod_of(docs, "DaemonSet", "gpushare-agent")
    assert pod["containers"][0]["image"] == "gpushare-agent@sha256:" + "a" * 64
    assert "runtimeClassName" not in pod
    assert pod["nodeSelector"] == {"gpushare.io/node": "true"}


def test_the_token_is_made_random_or_taken_from_an_existing_secret() -> None:
    made = find(objects(), "Secret", "gpushare-agent-token")["stringData"]["token"]
    assert len(made) == 48 and made != "REPLACE-WITH-A-LONG-RANDOM-TOKEN"
    docs = objects({"token": {"existingSecret": "my-token"}})
    assert not [d for d in docs if d["kind"] == "Secret"]
    volumes = {v["name"]: v for v in pod_of(docs, "DaemonSet", "gpushare-agent")["volumes"]}
    assert volumes["token"]["secret"]["secretName"] == "my-token"
    volumes = {v["name"]: v for v in pod_of(docs, "Deployment", "gpushare-scheduler")["volumes"]}
    assert volumes["agent-token"]["secret"]["secretName"] == "my-token"


@pytest.mark.parametrize("path", PATHS)
def test_the_path_turns_the_agents_device_plugin_and_driver_on_and_mounts_their_dirs(
    path: str,
) -> None:
    docs = objects({"path": path})
    config = agent_config(docs)
    assert config["kubelet"]["enabled"] is (path != "dra")
    assert config.get("dra", {}).get("enabled", False) is (path != "extender")
    pod = pod_of(docs, "DaemonSet", "gpushare-agent")
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    if config["kubelet"]["enabled"]:
        assert config["kubelet"]["plugin_dir"] in mounts
    if path != "extender":
        for key in ("plugin_dir", "registry_dir", "cdi_dir"):
            assert config["dra"][key] in mounts


@pytest.mark.parametrize("path", PATHS)
def test_the_agent_accepts_the_configuration_of_each_path(path: str) -> None:
    text = find(objects({"path": path}), "ConfigMap", "gpushare-agent-config")["data"]
    settings = load_settings(text["config.yaml"])
    assert settings.kubelet.enabled is (path != "dra")  # type: ignore[attr-defined]
    assert settings.dra.enabled is (path != "extender")  # type: ignore[attr-defined]


# -- MPS shared memory ---------------------------------------------------------------------


def mounts_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def host_path_at(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, str]:
    """The host directory a container has at ``path`` (a directory under one of its
    mounts) and that mount's propagation."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount_path, mount in sorted(mounts_of(container).items(), key=lambda m: -len(m[0])):
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            host = volumes[mount["name"]]["hostPath"]["path"]
            return host + path[len(mount_path) :], mount.get("mountPropagation", "None")
    raise AssertionError(f"{path} is under no mount of {container['name']}")


@pytest.mark.parametrize(
    "shm",
    [{}, {"hostPath": "/var/run/mps-shm", "size": "4Gi"}],
    ids=["default", "custom"],
)
@pytest.mark.parametrize("path", PATHS)
def test_each_device_gets_a_tmpfs_of_its_own_that_the_host_and_the_agent_see(
    path: str, shm: dict[str, str]
) -> None:
    """mps.shm_root is a directory of a host path that the mps-host pod mounts
    Bidirectional (the tmpfs it mounts per device there reaches the host, whose runtime
    binds it into the device's containers) and the agent's pod mounts at the same place
    receiving mounts (it empties the directory when the trust domain changes); no init
    container makes one tmpfs for every tenant any more. shm.hostPath stays the mps-host
    pod's /dev/shm and the kubelet.shm_dir / dra.shm_dir of daemons without their own, and
    never holds the per-device directories (a container given it would see them all)."""
    want = yaml.safe_load((CHART / "values.yaml").read_text())["shm"] | shm
    docs = objects({"path": path, "shm": shm})
    config = agent_config(docs)
    text = find(docs, "ConfigMap", "gpushare-agent-config")["data"]["config.yaml"]
    settings = load_settings(text)
    assert settings.mps.shm_size_bytes == (4 if shm else 1) * 2**30  # type: ignore[attr-defined]
    root = config["mps"]["shm_root"]
    assert root == "/run/gpushare/shm"

    host = pod_of(docs, "DaemonSet", "gpushare-mps-host")
    assert "initContainers" not in host
    [server] = host["containers"]
    assert server["securityContext"]["privileged"] is True  # mount(2), unshare(2)
    made_at, made_how = host_path_at(host, server, root)
    assert made_how == "Bidirectional"
    agent = pod_of(docs, "DaemonSet", "gpushare-agent")
    [serve] = agent["containers"]
    seen_at, seen_how = host_path_at(agent, serve, root)
    assert seen_at == made_at and seen_how in ("Bidirectional", "HostToContainer")

    named = []
    if config["kubelet"]["enabled"]:
        named.append(config["kubelet"]["shm_dir"])
    if config.get("dra", {}).get("enabled"):
        named.append(config["dra"]["shm_dir"])
    assert named and set(named) == {want["hostPath"]}
    assert host_path_at(host, server, "/dev/shm")[0] == want["hostPath"]
    shared = want["hostPath"].rstrip("/") + "/"
    assert not made_at.startswith(shared) and not shared.startswith(made_at.rstrip("/") + "/")


def test_an_empty_shm_size_turns_the_per_device_tmpfs_off() -> None:
    docs = objects({"shm": {"size": ""}})
    assert agent_config(docs)["mps"]["shm_root"] == ""
    host = pod_of(docs, "DaemonSet", "gpushare-mps-host")
    assert "initContainers" not in host
    assert "/dev/shm" in mounts_of(host["containers"][0])


# -- the plain manifests are the chart's output ---------------------------------------------


def test_the_plain_manifests_are_rendered_from_the_chart() -> None:
    """daemonset/*.yaml and deploy/ are written by deploy/render.sh; edit the chart."""
    files = RENDER.plain_files()
    stale = [f for f, text in files.items() if (REPO / f).read_text() != text]
    assert not stale, f"run deploy/render.sh: {stale} differ from the chart"
    # Every manifest of the agents is generated; what is not is named here with why.
    hand_written = {
        "deploy/dra/daemonset-patch.yaml": "a patch of daemonset.yaml: checked below",
        "deploy/dra/example.yaml": "an example workload, not part of the install",
    }
    for path in [*REPO.glob("daemonset/*.yaml"), *REPO.glob("deploy/*.yaml"),
                 *REPO.glob("deploy/dra/*.yaml")]:  # fmt: skip
        name = str(path.relative_to(REPO))
        assert name in files or name in hand_written, f"{name}: neither rendered nor listed"


def test_render_check_says_which_file_drifted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    done = subprocess.run(
        ["bash", str(REPO / "deploy" / "render.sh"), "--check"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    files = RENDER.plain_files()
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edited = tmp_path / "daemonset" / "mps-host.yaml"
    edited.write_text(edited.read_text().replace("/run/gpushare-shm", "/dev/shm"))
    monkeypatch.setattr(RENDER, "REPO", tmp_path)
    assert RENDER.main(["--check"]) == 1
    assert "daemonset/mps-host.yaml" in capsys.readouterr().out
    assert RENDER.main([]) == 0 and RENDER.main(["--check"]) == 0
    assert edited.read_text() == files["daemonset/mps-host.yaml"]


def test_the_dra_patch_adds_what_the_chart_adds_on_the_dra_path() -> None:
    """deploy/dra/daemonset-patch.yaml (for the plain manifests) mounts what the chart's
    DaemonSet mounts on the DRA path beyond the extender path's."""
    patch = yaml.safe_load((REPO / "deploy" / "dra" / "daemonset-patch.yaml").read_text())
    extender = pod_of(objects({"path": "extender"}), "DaemonSet", "gpushare-agent")
    dra = pod_of(objects({"path": "both"}), "DaemonSet", "gpushare-agent")
    added_volumes = [v for v in dra["volumes"] if v not in extender["volumes"]]
    added_mounts = [
        m for m in dra["containers"][0]["volumeMounts"]
        if m not in extender["containers"][0]["volumeMounts"]
    ]  # fmt: skip
    patched = patch["spec"]["template"]["spec"]
    assert patched["volumes"] == added_volumes
    assert patched["containers"][0]["volumeMounts"] == added_mounts
