"""The chart's defaults and knobs of issue 39, checked by what they do:

- the agents run only on nodes labelled gpushare.io/node=true, and `helm upgrade` refuses
  a render that would move them off the nodes earlier releases selected;
- the kube-scheduler image follows the cluster's version, and an offline render with
  Helm's default version is refused;
- each pod's PriorityClass is a value, or the chart's own PriorityClass;
- the MPS host pod has no limit that one OOM kill of every MPS server would come from;
- the agent's pod has what `gpushare doctor` reads there (the shm directory, and on the DRA
  path the RuntimeClass through its token).

A release in another namespace, or under another name: test_chart_namespace.py; the
values' schema and NOTES.txt: test_chart_schema.py."""

from __future__ import annotations

import subprocess
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart_values import VALUES, container_of
from tests.deploy.dra_manifests import allows
from tests.deploy.test_chart import (
    CHART,
    DRA_VERSIONS,
    EXTENDER_VERSIONS,
    KUBE_VERSION,
    RENDER,
    agent_config,
    containers,
    find,
    host_path_at,
    objects,
    pod_of,
    render,
)

OLD_SELECTOR = {"nvidia.com/gpu.present": "true"}
NEW_SELECTOR = {"gpushare.io/node": "true"}
DAEMONSETS = ("gpushare-agent", "gpushare-mps-host")


# -- 3. the nodes: opt-in, and upgrades that would move the MPS host pods refused ----------


def selectors(docs: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [pod_of(docs, "DaemonSet", name)["nodeSelector"] for name in DAEMONSETS]


def upgrade(values: dict[str, Any]) -> list[dict[str, Any]]:
    docs = []
    rendered = RENDER.render(values, namespace="gpushare", kube_version=KUBE_VERSION, upgrade=True)
    for text in rendered.values():
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def test_an_install_runs_only_on_the_nodes_labelled_for_it() -> None:
    assert VALUES["nodeSelector"] == {}
    assert selectors(objects()) == [NEW_SELECTOR, NEW_SELECTOR]
    mine = {"gpushare.io/node": "true", "pool": "a100"}
    assert selectors(objects({"nodeSelector": mine})) == [mine, mine]
    # a null drops a key; what --set makes of true is written as the string Kubernetes needs
    given = {"nvidia.com/gpu.present": None, "gpushare.io/node": True}
    assert selectors(objects({"nodeSelector": given})) == [NEW_SELECTOR, NEW_SELECTOR]


def test_an_upgrade_onto_the_new_default_is_refused_until_the_nodes_are_labelled() -> None:
    with pytest.raises(helm_python.HelmError) as refused:
        upgrade({})
    message = str(refused.value)
    for said in ("nodeSelector", "kubectl label node NODE gpushare.io/node=true",
                 "nodeSelectorMigrated=true", "nvidia.com/gpu.present"):  # fmt: skip
        assert said in message, said
    # the old nodes, named: the DaemonSets keep them
    assert selectors(upgrade({"nodeSelector": OLD_SELECTOR})) == [OLD_SELECTOR, OLD_SELECTOR]
    # the nodes labelled, and said so: the new default
    migrated = upgrade({"nodeSelectorMigrated": True})
    assert selectors(migrated) == [NEW_SELECTOR, NEW_SELECTOR]
    # an install is not an upgrade: nothing runs yet that a new selector would delete
    assert selectors(objects()) == [NEW_SELECTOR, NEW_SELECTOR]


def test_the_plain_manifests_keep_the_nodes_they_always_selected() -> None:
    """kubectl apply has no upgrade check: the plain manifests do not move the MPS host
    pods of an earlier install (render.py's PLAIN_VALUES)."""
    files = RENDER.plain_files()
    for name in ("daemonset/daemonset.yaml", "daemonset/mps-host.yaml"):
        pod = yaml.safe_load(files[name])["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == OLD_SELECTOR, name


# -- 4. the kube-scheduler follows the cluster -------------------------------------------


def scheduler_image(**render_options: Any) -> str:
    values = render_options.pop("values", {})
    rendered = RENDER.render(values, namespace="gpushare", **render_options)
    docs = [d for d in yaml.safe_load_all(rendered["scheduler/scheduler.yaml"]) if d]
    return str(container_of(docs, "Deployment", "gpushare-scheduler", "kube-scheduler")["image"])


def test_the_kube_scheduler_image_follows_the_clusters_version() -> None:
    assert VALUES["scheduler"]["version"] == ""
    image = "registry.k8s.io/kube-scheduler"
    assert scheduler_image(kube_version="v1.34.2-gke.1") == f"{image}:v1.34.2"
    assert scheduler_image(kube_version="v1.33.5") == f"{image}:v1.33.5"
    assert scheduler_image(kube_version="v1.31.4-eks-1a2b3c4") == f"{image}:v1.31.4"
    given = {"scheduler": {"version": "v1.32.1"}}
    assert scheduler_image(values=given, kube_version="v1.34.2") == f"{image}:v1.32.1"


def test_an_offline_render_with_helms_default_version_must_name_it() -> None:
    """Without a cluster Helm's own default (always vX.Y.0) is no cluster's version."""
    with pytest.raises(helm_python.HelmError, match=r"scheduler\.version is required"):
        RENDER.render({}, namespace="gpushare")
    given = {"scheduler": {"version": "v1.30.14"}}
    assert scheduler_image(values=given).endswith(":v1.30.14")
    assert not any(  # the DRA path runs no kube-scheduler of its own: nothing to name
        "kube-scheduler" in text for text in RENDER.render({"path": "dra"}).values()
    )
    docs = yaml.safe_load_all(RENDER.plain_files()["deploy/scheduler.yaml"])
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    [kube_scheduler] = [
        c for c in deployment["spec"]["template"]["spec"]["containers"]
        if c["name"] == "kube-scheduler"
    ]  # fmt: skip
    assert kube_scheduler["image"].endswith(":" + RENDER.PLAIN_VALUES["scheduler"]["version"])


# -- 6. priority classes -------------------------------------------------------------------

PODS = {  # value group: (kind, name)
    "agent": ("DaemonSet", "gpushare-agent"),
    "mpsHost": ("DaemonSet", "gpushare-mps-host"),
    "scheduler": ("Deployment", "gpushare-scheduler"),
    "draController": ("Deployment", "gpushare-dra-controller"),
}


def test_each_pods_priority_class_is_its_value() -> None:
    defaults = objects({"path": "both"})
    found = {group: pod_of(defaults, *pod).get("priorityClassName") for group, pod in PODS.items()}
    assert found == {
        "agent": "system-node-critical",
        "mpsHost": "system-node-critical",
        "scheduler": "system-cluster-critical",
        "draController": "system-cluster-critical",
    }
    given = {group: {"priorityClassName": f"pc-{group.lower()}"} for group in PODS}
    docs = objects({"path": "both", **given})
    for group, pod in PODS.items():
        assert pod_of(docs, *pod)["priorityClassName"] == f"pc-{group.lower()}"
    none = objects({"path": "both", **{group: {"priorityClassName": ""} for group in PODS}})
    for pod in PODS.values():
        assert "priorityClassName" not in pod_of(none, *pod)
    assert not [d for d in docs if d["kind"] == "PriorityClass"]


@pytest.mark.parametrize("value", [None, 1000])
def test_the_charts_own_priority_class_is_made_valid_and_used_by_every_pod(
    value: int | None,
) -> None:
    own: dict[str, Any] = {"create": True}
    if value is not None:
        own["value"] = value
    docs = objects({"path": "both", "priorityClass": own})
    made = find(docs, "PriorityClass")
    assert made["metadata"]["name"] == "gpushare-critical"
    assert made["value"] == (value if value is not None else 1_000_000_000)
    assert made["globalDefault"] is False
    for version in (*EXTENDER_VERSIONS, *DRA_VERSIONS):
        kubernetes_validate.validate(made, version, strict=True)
    for pod in PODS.values():
        assert pod_of(docs, *pod)["priorityClassName"] == "gpushare-critical"
    with pytest.raises(helm_python.HelmError, match="priorityClass"):
        render({"priorityClass": {"create": True, "value": 2_000_000_000}})


# -- 8. the MPS host pod ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["extender", "dra"])
def test_the_mps_host_pod_has_requests_and_no_limit_by_default(path: str) -> None:
    [host] = pod_of(objects({"path": path}), "DaemonSet", "gpushare-mps-host")["containers"]
    assert host["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"}}
    sized = {"limits": {"memory": "8Gi"}}
    [host] = pod_of(objects({"mpsHost": {"resources": sized}}), "DaemonSet", "gpushare-mps-host")[
        "containers"
    ]
    assert host["resources"]["limits"] == {"memory": "8Gi"}
    assert host["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}


# -- 5. what `gpushare doctor` reads in the agent's pod -----------------------------------


@pytest.mark.parametrize("shm", [{}, {"hostPath": "/var/run/mps-shm"}], ids=["default", "custom"])
@pytest.mark.parametrize("path", ["extender", "dra", "both"])
def test_the_agents_pod_sees_the_shm_directory_the_doctor_checks(
    path: str, shm: dict[str, str]
) -> None:
    """The doctor (agent/doctor/gather.py shm_facts) looks at kubelet.shm_dir
    or dra.shm_dir, and mps.shm_root, from inside the agent's container: each is there, the
    host directory the mps-host pod uses."""
    docs = objects({"path": path, "shm": shm})
    config = agent_config(docs)
    agent = pod_of(docs, "DaemonSet", "gpushare-agent")
    [serve] = [c for c in containers(agent) if c["name"] == "agent"]
    host = pod_of(docs, "DaemonSet", "gpushare-mps-host")
    [server] = host["containers"]
    named = {
        section["shm_dir"]
        for section in (config["kubelet"], config.get("dra", {}))
        if section.get("enabled")
    }
    assert len(named) == 1
    [shared] = named
    assert host_path_at(agent, serve, shared)[0] == shared == (shm or VALUES["shm"])["hostPath"]
    assert host_path_at(host, server, "/dev/shm")[0] == shared
    root = config["mps"]["shm_root"]
    assert host_path_at(agent, serve, root) == host_path_at(host, server, root)


def test_on_the_dra_path_the_agents_token_may_read_what_the_doctor_asks() -> None:
    """In the agent's pod the doctor asks the API with the pod's token (the DRA path
    projects one): the Node and the RuntimeClass the pods run under."""
    docs = objects({"path": "dra"})
    role = find(docs, "ClusterRole", "gpushare-dra-driver")
    runtime_class = VALUES["runtimeClassName"]
    assert allows(role["rules"], "node.k8s.io", "runtimeclasses", "get", runtime_class)
    assert allows(role["rules"], "", "nodes", "get", "worker-1")
    assert not allows(role["rules"], "node.k8s.io", "runtimeclasses", "list", None)
    binding = find(docs, "ClusterRoleBinding", "gpushare-dra-driver")
    assert (
        binding["subjects"][0]["name"]
        == pod_of(docs, "DaemonSet", "gpushare-agent")["serviceAccountName"]
    )


def test_helm_lint_stays_clean_with_the_defaults() -> None:
    """helm lint renders in lint mode, where `fail` is only logged: the default values lint
    clean whatever Kubernetes version it is given (a render refuses, above)."""
    for version in ("v1.33.5", None):
        report = helm_python.lint(str(CHART), {}, strict=True, kube_version=version)
        assert report["errors"] == [], report
    done = subprocess.run(  # the plain manifests name their scheduler.version
        ["bash", str(CHART.parents[1] / "render.sh"), "--check"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
