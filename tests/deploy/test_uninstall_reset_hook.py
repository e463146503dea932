"""The uninstall hook's compute-mode reset (uninstall.resetComputeMode, opt-in): on every
path, the pre-delete hook gains a DaemonSet on the agents' nodes whose pods run `gpushare
gpu reset-compute-mode`, which waits for the node's agent to stop and holds its lock (its
effect beside a real agent: tests/unit/gpu/test_reset_compute_mode_cli.py), and the Job
deletes the agents' DaemonSet and waits for the reset with `gpushare kube wait-rollout
--delete-first` (tests/kube/test_wait_rollout.py).

Checked as rendered: the objects are valid hooks in the right order, the DaemonSet sits
where the agents do, can reset a GPU and reaches the lock the agents take (their own
configuration, the same host directory), the Job's steps name what the chart renders, the
timeouts nest, and the Job's steps, run in order as the Job runs them against the stand-in
API server, make exactly the calls its roles grant, each DaemonSet by its name."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from agent.config.loading import load_settings
from agent.legacy.cluster.annotations import FINALIZER
from agent.runtime.lock import InstanceLock
from tests.deploy.dra_manifests import grants
from tests.deploy.job_pod import JobPod
from tests.deploy.test_chart import DRA_VERSIONS, EXTENDER_VERSIONS, RENDER, pod_of
from tests.deploy.test_uninstall_hook import (
    BASE_VALUES,
    NS,
    one,
    rbac_call,
    run_job,
)
from tests.kubeworld.apiserver import FakeApiServer

HOOKS = ("hooks/pre-delete.yaml", "hooks/reset-compute-mode.yaml")
RESET = {"uninstall": {"resetComputeMode": {"enabled": True}}}
DS = "gpushare-reset-compute-mode"
AGENTS = "gpushare-agent"


def rendered(values: dict[str, Any]) -> dict[str, str]:
    return RENDER.render({**BASE_VALUES, **values}, namespace=NS)  # type: ignore[no-any-return]


def hooks(values: dict[str, Any]) -> list[dict[str, Any]]:
    files = rendered(values)
    return [d for t in HOOKS for d in yaml.safe_load_all(files.get(t, "")) if d]


def steps(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Job's containers in the order they run (init containers first)."""
    pod = one(docs, "Job")["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def with_reset(path: str, **reset: Any) -> dict[str, Any]:
    return {"path": path, "uninstall": {"resetComputeMode": {"enabled": True, **reset}}}


@pytest.mark.parametrize(
    ("path", "kinds", "versions"),
    [
        ("extender", ["ClusterRole", "ClusterRoleBinding"], EXTENDER_VERSIONS),
        ("both", ["ClusterRole", "ClusterRoleBinding"], DRA_VERSIONS),
        ("dra", [], DRA_VERSIONS),  # no finalizer to release: the reset alone
    ],
)
def test_with_the_reset_every_path_has_the_hook_in_order_and_valid(
    path: str, kinds: list[str], versions: tuple[str, ...]
) -> None:
    docs = hooks(with_reset(path))
    assert sorted(d["kind"] for d in docs) == sorted(
        [*kinds, "DaemonSet", "Job", "Role", "RoleBinding", "ServiceAccount"]
    )
    weights = {}
    for doc in docs:
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        policy = set(annotations["helm.sh/hook-delete-policy"].split(","))
        assert policy == {"before-hook-creation", "hook-succeeded"}, doc["kind"]
        weights[doc["kind"]] = int(annotations["helm.sh/hook-weight"])
        assert doc["metadata"].get("namespace", NS) == NS
        for version in versions:
            kubernetes_validate.validate(doc, version, strict=True)
    # accounts and roles, then the DaemonSet (not waited for by Helm), then the Job
    assert (
        max(w for k, w in weights.items() if k not in ("DaemonSet", "Job")) < weights["DaemonSet"]
    )
    assert weights["DaemonSet"] < weights["Job"]


def test_by_default_the_dra_path_has_no_hook_and_the_extender_path_no_reset() -> None:
    assert hooks({"path": "dra"}) == []
    docs = hooks({"path": "extender"})
    assert "DaemonSet" not in {d["kind"] for d in docs}
    assert [c["args"] for c in steps(docs)] == [["kube", "release-finalizers"]]


@pytest.mark.parametrize("path", ["extender", "both", "dra"])
def test_the_jobs_steps_release_then_delete_the_agents_then_wait_for_the_reset(
    path: str,
) -> None:
    values = with_reset(path, timeoutSeconds=45, agentWaitSeconds=30)
    docs = hooks(values)
    daemon_set = one(docs, "DaemonSet")
    agents = agent_daemon_set(values)
    job = one(docs, "Job")
    wait = ["kube", "wait-rollout", f"daemonset/{daemon_set['metadata']['name']}"]
    wait += ["--namespace", daemon_set["metadata"]["namespace"]]
    wait += ["--delete-first", f"daemonset/{agents['metadata']['name']}", "--timeout-s", "45"]
    assert agents["metadata"]["namespace"] == daemon_set["metadata"]["namespace"]
    release = [["kube", "release-finalizers"]] if path != "dra" else []
    assert [c["args"] for c in steps(docs)] == [*release, wait]
    # the timeouts nest: each pod's wait for its agent < the Job's wait < the Job's deadline
    [container] = daemon_set["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--wait-agent-s") + 1] == "30"
    assert job["spec"]["activeDeadlineSeconds"] > 45  # time left to name the nodes
    # exit 2 (no account, RBAC refusing) fails the Job at once, whichever step has it
    [rule] = job["spec"]["podFailurePolicy"]["rules"]
    assert "containerName" not in rule["onExitCodes"] and rule["onExitCodes"]["values"] == [2]


def agent_daemon_set(values: dict[str, Any]) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(rendered(values)["agent/daemonset.yaml"]) if d]
    [agents] = [d for d in docs if d["kind"] == "DaemonSet"]
    return agents  # type: ignore[no-any-return]


def test_the_reset_pods_sit_where_the_agents_do_and_can_reset_a_gpu() -> None:
    values = {
        **with_reset("both"),
        "nodeSelector": {"team": "ml"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "runtimeClassName": "nvidia-cdi",
        "image": {"pullSecrets": [{"name": "regcred"}]},
    }
    files = rendered(values)
    agent_docs = [d for d in yaml.safe_load_all(files["agent/daemonset.yaml"]) if d]
    agent = pod_of(agent_docs, "DaemonSet", "gpushare-agent")
    docs = hooks(values)
    daemon_set = one(docs, "DaemonSet")
    pod = daemon_set["spec"]["template"]["spec"]
    for key in ("nodeSelector", "runtimeClassName", "imagePullSecrets", "priorityClassName"):
        assert pod.get(key) == agent.get(key), key
    assert all(t in agent["tolerations"] for t in pod["tolerations"])
    assert pod["tolerations"] == values["tolerations"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False
    labels = daemon_set["spec"]["selector"]["matchLabels"]
    assert labels.items() <= pod_labels(daemon_set).items()
    [container] = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    assert container["securityContext"]["runAsUser"] == 0
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")  # libnvidia-ml
    args = container["args"]
    assert args[2:4] == ["gpu", "reset-compute-mode"] and "--hold" in args
    done = args[args.index("--done-file") + 1]
    # the probe reads the file the command writes, on a volume it may write to
    assert container["readinessProbe"]["exec"]["command"][-1] == done
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert any(done.startswith(path + "/") for path in mounts)
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_reset_pod_takes_the_very_lock_the_agent_takes() -> None:
    """The reset pod reads the agents' own configuration (their ConfigMap), and the lock
    files that configuration names are the same host files in both pods (what taking
    that lock does beside a real agent: test_reset_compute_mode_cli.py)."""
    values = {**with_reset("both"), "agentConfig": {"runtime": {"lock_wait_s": 30}}}
    files = rendered(values)
    agent = pod_of([d for d in yaml.safe_load_all(files["agent/daemonset.yaml"]) if d],
                   "DaemonSet", AGENTS)  # fmt: skip
    pod = one(hooks(values), "DaemonSet")["spec"]["template"]["spec"]
    [reset] = pod["containers"]
    [agent_container] = [c for c in agent["containers"] if c["name"] == "agent"]
    config_path = reset["args"][reset["args"].index("--config") + 1]
    assert config_path == agent_container["args"][agent_container["args"].index("--config") + 1]
    assert host_file(pod, reset, config_path) == host_file(agent, agent_container, config_path)
    [configmap] = [d for d in yaml.safe_load_all(files["agent/configmap.yaml"]) if d]
    settings = load_settings(configmap["data"]["config.yaml"])
    assert settings.runtime.lock_wait_s == 30  # the agents' configuration, passthrough too
    lock = InstanceLock(settings.unix_socket_path, mps_root=settings.mps_root_dir)
    for path in (lock.path, f"{settings.mps_root_dir}.lock"):  # the agent's lock files
        assert host_file(pod, reset, path) == host_file(agent, agent_container, path), path
        assert host_file(pod, reset, path)[0] == "hostPath:/run/gpushare"


def host_file(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, str]:
    """(the volume's source: a host path or a ConfigMap, the path inside it) of ``path`` as
    ``container`` sees it."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    best = max(
        (m for m in container["volumeMounts"]
         if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")),
        key=lambda m: len(m["mountPath"]),
    )  # fmt: skip
    volume = volumes[best["name"]]
    source = (
        f"hostPath:{volume['hostPath']['path']}"
        if "hostPath" in volume
        else f"configMap:{volume['configMap']['name']}"
    )
    inside = best.get("subPath") or path.removeprefix(best["mountPath"]).lstrip("/")
    return source, inside


def pod_labels(daemon_set: dict[str, Any]) -> dict[str, str]:
    return daemon_set["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def test_the_reset_follows_the_name_override() -> None:
    docs = hooks({**with_reset("dra"), "nameOverride": "gpu"})
    assert one(docs, "DaemonSet")["metadata"]["name"] == "gpu-reset-compute-mode"
    assert steps(docs)[-1]["args"][2] == "daemonset/gpu-reset-compute-mode"


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (
            {"uninstall": {"hook": {"enabled": False}, "resetComputeMode": {"enabled": True}}},
            "uninstall.resetComputeMode.enabled needs uninstall.hook.enabled",
        ),
        (
            {"uninstall": {"resetComputeMode": {"enabled": True, "timeoutSeconds": 120}}},
            r"uninstall.resetComputeMode.timeoutSeconds \(120\) must be below "
            r"uninstall.hook.timeoutSeconds \(120\)",
        ),
        (
            {"uninstall": {"resetComputeMode": {"enabled": True, "agentWaitSeconds": 90}}},
            r"uninstall.resetComputeMode.agentWaitSeconds \(90\) must be below "
            r"uninstall.resetComputeMode.timeoutSeconds \(90\)",
        ),
        ({"uninstall": {"resetComputeMode": {"agentWaitSeconds": 0}}}, "agentWaitSeconds"),
        ({"uninstall": {"resetComputeMode": True}}, "resetComputeMode"),
        ({"uninstall": {"resetComputeMode": {"enable": True}}}, "enable"),
        ({"uninstall": {"resetComputeMode": {"timeoutSeconds": 0}}}, "timeoutSeconds"),
        ({"uninstall": {"hook": {"timeoutSeconds": "2m"}}}, "timeoutSeconds"),
    ],
    ids=[
        "needs-the-hook",
        "wait-past-the-deadline",
        "agent-wait-past-the-wait",
        "agent-wait-zero",
        "a-bool",
        "unknown-key",
        "zero",
        "text",
    ],
)
def test_wrong_values_are_refused_naming_the_key(values: dict[str, Any], said: str) -> None:
    with pytest.raises(helm_python.HelmError, match=said):
        rendered({"path": "dra", **values})


def test_the_reset_is_off_by_default_and_helm_only() -> None:
    chart = Path(RENDER.__file__).parent / "gpushare"
    uninstall = yaml.safe_load((chart / "values.yaml").read_text())["uninstall"]
    reset = uninstall["resetComputeMode"]
    assert reset["enabled"] is False
    assert 0 < reset["agentWaitSeconds"] < reset["timeoutSeconds"]
    assert reset["timeoutSeconds"] < uninstall["hook"]["timeoutSeconds"]
    # an agent stops within its pod's grace period: the default wait outlasts it
    grace = agent_daemon_set({})["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert reset["agentWaitSeconds"] > grace
    plain = {template for _, targets in RENDER.RENDERS for template in targets}
    assert not any(t.startswith("hooks/") for t in plain)


def named_grants(*roles: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, name) of every grant; name "*" where the rule names none."""
    rules = [rule for role in roles for rule in role["rules"]]
    return {(group, resource, verb, name or "*") for group, resource, verb, name in grants(rules)}


def named_call(method: str, path_qs: str) -> tuple[str, str, str, str]:
    """(group, resource, verb, name) of a request; name "*" for a list or watch."""
    group, resource, verb, _ = rbac_call(method, path_qs)
    parts = path_qs.partition("?")[0].strip("/").split("/")
    return group, resource, verb, "*" if verb in ("list", "watch") else parts[-1]


async def test_the_jobs_steps_make_exactly_the_calls_their_roles_grant_in_order(
    job_pod: JobPod,
) -> None:
    """Each step run in turn as the Job runs it (its argv, its pod's service account), the
    wait until its timeout, which also lists the pods: the finalizers are released, then
    the agents' DaemonSet is deleted (Background), then the reset is read; every call is
    granted, by name where RBAC can name it, and every grant is used."""
    values = with_reset("both", timeoutSeconds=2, agentWaitSeconds=1)
    docs = hooks(values)
    daemon_set = one(docs, "DaemonSet")
    daemon_set["metadata"]["generation"] = 1
    daemon_set["status"] = {"observedGeneration": 1, "desiredNumberScheduled": 1}
    async with FakeApiServer(token=job_pod.token, ssl_context=job_pod.server_tls) as api:
        api.put_object("daemonsets", daemon_set)
        api.put_object("daemonsets", agent_daemon_set(values))
        api.create_pod("train", "team-a", finalizers=[FINALIZER], node_name="n1")
        api.fail_next("PATCH", r"/namespaces/team-a/pods/train$", 409, reason="Conflict")
        ran = [
            await run_job([sys.executable, "-m", "agent", *c["args"]], job_pod.env(api.url, c))
            for c in steps(docs)
        ]
        calls = [(named_call(m, p), rbac_call(m, p)[3]) for m, p, _ in api.log]
        left = {name for _, name in api.objects["daemonsets"]}
        deletions = api.deletions
    assert [r.returncode for r in ran] == [0, 1], [r.stdout + r.stderr for r in ran]
    assert "released the finalizer of team-a/train" in ran[0].stdout
    assert "1 of 1 pods not created yet" in ran[-1].stdout  # never ready: the timeout
    firsts = [c for i, c in enumerate(calls) if c not in calls[:i]]
    assert firsts == [
        (("", "pods", "list", "*"), True),  # release-finalizers: every namespace
        (("", "pods", "patch", "train"), False),
        (("", "pods", "get", "train"), False),  # after the 409
        (("apps", "daemonsets", "delete", AGENTS), False),  # then the agents go
        (("apps", "daemonsets", "get", DS), False),  # then the wait
        (("", "pods", "list", "*"), False),  # its timeout: the reset's pods, in NS
    ]
    assert left == {DS}  # the agents' DaemonSet is gone at once, its pods after it
    assert [options.get("propagationPolicy") for _, options in deletions] == ["Background"]
    role, cluster_role = named_grants(one(docs, "Role")), named_grants(one(docs, "ClusterRole"))
    wait_calls = {c for c, _ in calls[calls.index(firsts[3]) :]}
    assert role == wait_calls, f"granted, not used: {role - wait_calls}"
    release_calls = {c for c, _ in calls[: calls.index(firsts[3])]}
    assert cluster_role == {(g, r, v, "*") for g, r, v, _ in release_calls}
