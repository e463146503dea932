"""The chart's pre-delete hook (templates/hooks/pre-delete.yaml): on the paths whose webhook
gives share pods the finalizer gpushare.io/lease, `helm uninstall` first runs a Job that
removes that finalizer, under a service account and ClusterRole of its own.

The objects are checked as rendered: each is a hook with its weight and delete policy, and
RBAC comes before the Job. Then the Job's command runs as the Job would run it: its argv
from the rendered Job, as a real process, in a simulated pod (KUBERNETES_SERVICE_HOST and
_PORT, a service account token and CA), against the API stand-in over TLS. It must remove
our finalizer and only ours, and the ClusterRole must grant exactly the calls the stand-in
saw."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agent.kubeapi.connection import SERVICE_ACCOUNT
from agent.legacy.cluster.annotations import FINALIZER
from tests.deploy.job_pod import JobPod
from tests.deploy.test_chart import RENDER
from tests.helpers import REPO, subprocess_env
from tests.kubeworld.apiserver import FakeApiServer

CHART = REPO / "deploy" / "helm" / "gpushare"
TEMPLATE = "hooks/pre-delete.yaml"
HOOK = "gpushare-uninstall"
DELETE_POLICY = {"before-hook-creation", "hook-succeeded"}
NS = "gpushare"
# An offline render does not know the cluster's version: the scheduler's is named.
BASE_VALUES: dict[str, Any] = {"scheduler": {"version": "v1.31.0"}}


def hooks(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The hook's objects as the chart renders them (namespace ``NS``)."""
    rendered = RENDER.render({**BASE_VALUES, **(values or {})}, namespace=NS)
    return [d for d in yaml.safe_load_all(rendered.get(TEMPLATE, "")) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, (kind, len(found))
    return found[0]


def job_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = one(docs, "Job")["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# -- the rendered hook ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["extender", "both"])
def test_the_hook_is_rendered_where_pods_get_the_finalizer(path: str) -> None:
    docs = hooks({"path": path})
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Job",
        "ServiceAccount",
    ]
    assert {d["metadata"]["name"] for d in docs} == {HOOK}
    assert all(d["metadata"].get("namespace", NS) == NS for d in docs)


def test_the_hook_follows_the_name_and_namespace_overrides() -> None:
    docs = hooks({"nameOverride": "gpu", "namespaceOverride": "team-gpu"})
    assert {d["metadata"]["name"] for d in docs} == {"gpu-uninstall"}
    assert {d["metadata"].get("namespace") for d in docs} == {None, "team-gpu"}
    assert one(docs, "ClusterRoleBinding")["subjects"][0]["namespace"] == "team-gpu"
    assert one(docs, "Job")["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-uninstall"


@pytest.mark.parametrize(
    "values",
    [{"path": "dra"}, {"path": "extender", "uninstall": {"hook": {"enabled": False}}}],
    ids=["dra-path-has-no-finalizer", "turned-off"],
)
def test_no_hook_without_the_finalizer_or_when_turned_off(values: dict[str, Any]) -> None:
    assert hooks(values) == []


def test_every_object_is_a_pre_delete_hook_and_rbac_comes_before_the_job() -> None:
    docs = hooks()
    weights = {}
    for doc in docs:
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete", doc["kind"]
        assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == DELETE_POLICY
        weights[doc["kind"]] = int(annotations["helm.sh/hook-weight"])
    job = weights.pop("Job")
    assert all(weight < job for weight in weights.values()), weights


@pytest.mark.parametrize("version", ["1.30.0", "1.34.0", "1.37.0"])
def test_the_hook_objects_validate(version: str) -> None:
    for doc in hooks({"path": "both"}):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_job_runs_the_command_in_the_agents_image_under_its_own_account() -> None:
    values = {
        "image": {"registry": "r.example/", "repository": "gs", "digest": "sha256:" + "a" * 64},
        "uninstall": {"hook": {"timeoutSeconds": 77}},
    }
    docs = hooks(values)
    account = one(docs, "ServiceAccount")
    role = one(docs, "ClusterRole")
    binding = one(docs, "ClusterRoleBinding")
    job = one(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    container = job_container(docs)
    assert container["image"] == "r.example/gs@sha256:" + "a" * 64
    assert "command" not in container  # the image's entrypoint: gpushare
    assert container["args"][:2] == ["kube", "release-finalizers"]
    # no API server named: the pod's service account, whose token is mounted
    assert not any(a.startswith("--api-") for a in container["args"])
    assert not any(e["name"].startswith("GPUSHARE_") for e in container.get("env", []))
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod.get("automountServiceAccountToken", True) is True
    assert account.get("automountServiceAccountToken", True) is True
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NS}
    ]
    assert job["spec"]["activeDeadlineSeconds"] == 77
    assert pod["restartPolicy"] == "Never"
    # a configuration error (exit 2) is not tried again
    [rule] = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [2]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_the_hook_is_helm_only_and_its_values_have_their_defaults() -> None:
    plain = {template for _, targets in RENDER.RENDERS for template in targets}
    assert not any(t.startswith("hooks/") for t in plain)
    uninstall = yaml.safe_load((CHART / "values.yaml").read_text())["uninstall"]
    assert uninstall["hook"]["enabled"] is True
    assert 0 < uninstall["hook"]["timeoutSeconds"] < 300  # below helm's --timeout, 5m


def test_the_images_entrypoint_is_the_cli_that_python_m_agent_runs() -> None:
    """Why the effect test below may run the Job's args as ``python -m agent``."""
    dockerfile = (REPO / "daemonset" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["gpushare"]' in dockerfile
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["gpushare"] == "agent.cli.main:main"
    assert "from agent.cli.main import main" in (REPO / "agent" / "__main__.py").read_text()


# -- the Job's command, run as the Job runs it ---------------------------------------------


def rbac_call(method: str, path_qs: str) -> tuple[str, str, str, bool]:
    """(API group, resource, verb, cluster-wide) of a request, as RBAC authorizes it."""
    path, _, query = path_qs.partition("?")
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespaced = len(rest) > 2 and rest[0] == "namespaces"
    if namespaced:
        rest = rest[2:]
    resource = "/".join([rest[0], *rest[2:3]])
    named = len(rest) > 1
    if method == "GET":
        verb = "watch" if "watch=" in query else "get" if named else "list"
    else:
        verb = {"PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}[method]
    return group, resource, verb, not namespaced


async def run_job(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, argv, env=env, capture_output=True, text=True, timeout=60, check=False
    )


async def test_the_jobs_command_removes_only_our_finalizer_with_only_the_calls_granted(
    job_pod: JobPod,
) -> None:
    docs = hooks()
    argv = [sys.executable, "-m", "agent", *job_container(docs)["args"]]
    async with FakeApiServer(token=job_pod.token, ssl_context=job_pod.server_tls) as api:
        api.create_pod("running", "team-a", finalizers=[FINALIZER], node_name="n1")
        api.create_pod("ending", "team-a", finalizers=[FINALIZER], node_name="n1")
        api.create_pod(
            "ending-kept", "team-b", finalizers=["example.com/keep", FINALIZER], node_name="n2"
        )
        api.create_pod("others", "team-b", finalizers=["example.com/keep"])
        api.create_pod("plain", "default")
        for namespace, name in (("team-a", "ending"), ("team-b", "ending-kept")):
            api.delete_pod(namespace, name)  # Terminating while a finalizer stays
        untouched = {
            name: api.pod(namespace, name)["metadata"]["resourceVersion"]  # type: ignore[index]
            for namespace, name in (("team-b", "others"), ("default", "plain"))
        }
        # one write lost to a concurrent one: the command reads the pod again (get)
        api.fail_next("PATCH", r"/namespaces/team-a/pods/running$", 409, reason="Conflict")
        done = await run_job(argv, job_pod.env(api.url, job_container(docs)))
        assert done.returncode == 0, done.stdout + done.stderr

        running = api.pod("team-a", "running")
        assert running is not None and not running["metadata"].get("finalizers")
        assert "deletionTimestamp" not in running["metadata"]  # released, not deleted
        assert api.pod("team-a", "ending") is None  # its deletion completed
        kept = api.pod("team-b", "ending-kept")
        assert kept is not None and kept["metadata"]["finalizers"] == ["example.com/keep"]
        assert "deletionTimestamp" in kept["metadata"]  # still Terminating, for the other
        for namespace, name in (("team-b", "others"), ("default", "plain")):
            pod = api.pod(namespace, name)
            assert pod is not None and pod["metadata"]["resourceVersion"] == untouched[name]
        for name in ("team-a/running", "team-a/ending", "team-b/ending-kept"):
            assert f"released the finalizer of {name}" in done.stdout

        calls = [rbac_call(method, path) for method, path, _ in api.log]
        patched = {path for method, path, _ in api.log if method == "PATCH"}
        assert patched == {
            "/api/v1/namespaces/team-a/pods/running",
            "/api/v1/namespaces/team-a/pods/ending",
            "/api/v1/namespaces/team-b/pods/ending-kept",
        }
    assert ("", "pods", "list", True) in calls  # every namespace: a ClusterRole is needed
    assert ("", "pods", "get", False) in calls  # the conflict above
    seen = {(group, resource, verb) for group, resource, verb, _ in calls}
    granted = grants(one(docs, "ClusterRole"))
    assert granted == seen, f"granted, not used: {granted - seen}; used: {seen - granted}"


async def test_outside_a_pod_the_jobs_command_is_a_configuration_error() -> None:
    """No --api-server: the pod's service account or nothing (exit 2, which the Job's
    podFailurePolicy does not try again)."""
    env = subprocess_env()
    for name in ("GPUSHARE_KUBE_API_SERVER", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(name, None)
    if Path(SERVICE_ACCOUNT, "token").exists():
        pytest.skip("this machine is a pod")
    argv = [sys.executable, "-m", "agent", *job_container(hooks())["args"]]
    done = await run_job(argv, env)
    assert done.returncode == 2 and "not in a cluster" in done.stderr, done.stderr
