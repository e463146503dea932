"""The cluster side's manifests (deploy/) agree with the Kubernetes schemas, with each
other, with the agents' manifests (daemonset/) and with the code they run: the options of
``gpushare kube serve``, the webhook's and the extender's routes, and the API calls the RBAC
rules must allow. The agents' side and the kind bring-up: test_kube_kind.py."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.legacy.cluster.agents import GRPC_PORT_NAME
from agent.legacy.cluster.annotations import FINALIZER, RESOURCE, SCHEDULER_NAME, parse_ask
from agent.legacy.cluster.podrules import check_new_pod
from agent.legacy.cluster.webhook import build_webhook_app, mutation
from tests.deploy.kube_manifests import (
    BIN,
    DEPLOY,
    KIND,
    NAMESPACE,
    container,
    documents,
    find,
    kube_version,
    port_of,
    rest_calls,
    scheduler_config,
    scheduler_pod,
    serve_args,
    validate,
)
from tests.helpers import REPO

# Files under deploy/ that are not Kubernetes objects, so no schema applies to them.
NOT_OBJECTS = {
    KIND / "kind-config.yaml": "kind's own cluster configuration (kind.x-k8s.io), checked below",
    KIND / "kind-config-dra.yaml": "kind's own, checked in test_dra_kind.py",
    KIND / "agent-daemonset-patch.yaml": "a JSON patch; the DaemonSet it makes is validated",
}
# The DRA driver's manifests (resource.k8s.io/v1, Kubernetes 1.34 and later, not the
# kube-scheduler's version here): tests/deploy/test_dra_manifests.py validates them.
DRA = DEPLOY / "dra"
# Kinds whose schemas are not Kubernetes' own: kubernetes-validate warns and skips them.
NOT_IN_KUBERNETES = {
    ("cert-manager.io/v1", "Certificate"): "a cert-manager CRD",
    ("cert-manager.io/v1", "Issuer"): "a cert-manager CRD",
}
# The Helm chart the plain manifests are rendered from (tests/deploy/test_chart.py).
HELM = DEPLOY / "helm"
MANIFESTS = sorted(
    p
    for p in DEPLOY.rglob("*.yaml")
    if p not in NOT_OBJECTS and DRA not in p.parents and HELM not in p.parents
)

# `gpushare kube serve`'s options (agent/cli/kube.py).
KUBE_SERVE_OPTIONS = {
    "--api-server", "--api-token-file", "--api-ca", "--agents-namespace", "--agents-service",
    "--agent-ca", "--agent-cert", "--agent-key", "--agent-token-file", "--insecure-agents",
    "--extender-listen", "--webhook-listen", "--webhook-cert", "--webhook-key",
    "--reconcile-interval-s", "--hold-s", "--gang-ttl-s", "--discovery-interval-s",
    "--node-state-interval-s", "--log-level", "--agent-server-name", "--lease-grace-s",
    "--leader-elect", "--no-leader-elect", "--leader-elect-namespace", "--leader-elect-lease",
    "--leader-elect-lease-duration-s", "--leader-elect-renew-deadline-s",
    "--leader-elect-retry-period-s",
}  # fmt: skip


# Resources the gpushare container reads in its own namespace only (a Role, not cluster-wide).
NAMESPACED = {("discovery.k8s.io", "endpointslices"), ("coordination.k8s.io", "leases")}
# The roles the kube-scheduler container is bound to, built into Kubernetes.
BUILT_IN_ROLES = {
    ("ClusterRole", "system:kube-scheduler"),
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}


# -- schemas -----------------------------------------------------------------------------


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_each_manifest_validates_against_the_kubernetes_schema(manifest: Path) -> None:
    """Strict, against kubernetes-validate's default version and the one the shipped
    kube-scheduler is for; only the kinds listed above may lack a schema."""
    for version in ([], ["-k", kube_version()]):
        output = validate(manifest, *version)
        for line in output.splitlines():
            missing = re.search(r"Couldn't find schema for kind (\S+) with api version (\S+)", line)
            if missing:
                assert (missing[2], missing[1]) in NOT_IN_KUBERNETES, line
    for document in documents(manifest):
        assert document["apiVersion"] and document["kind"] and document["metadata"]["name"]
        if document["kind"] not in ("ClusterRole", "ClusterRoleBinding", "Namespace"):
            cluster_scoped = ("WebhookConfiguration", "AdmissionPolicy", "AdmissionPolicyBinding")
            if document["kind"].endswith(cluster_scoped):
                continue
            assert document["metadata"].get("namespace"), f"{manifest.name}: {document['kind']}"


def test_the_files_left_out_of_the_schemas_are_what_they_say() -> None:
    cluster = yaml.safe_load((KIND / "kind-config.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("kind.x-k8s.io/v1alpha4", "Cluster")
    roles = [n["role"] for n in cluster["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") >= 1
    patch = yaml.safe_load((KIND / "agent-daemonset-patch.yaml").read_text())
    assert isinstance(patch, list) and all(
        op["op"] in ("test", "replace", "remove") for op in patch
    )


# -- the second scheduler ------------------------------------------------------------------


def test_the_scheduler_configuration_names_gpushare_and_its_extender() -> None:
    config = scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [SCHEDULER_NAME]
    election = config["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceName"] == "gpushare-scheduler" != "kube-scheduler"
    assert election["resourceNamespace"] == NAMESPACE and election["resourceLock"] == "leases"
    [extender] = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:" + str(
        port_of(serve_args()["--extender-listen"])
    )
    assert serve_args()["--extender-listen"].startswith("127.0.0.1:")
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["enableHTTPS"] is False and extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False and extender["weight"] > 0
    assert extender["managedResources"] == [{"name": RESOURCE, "ignoredByScheduler": True}]
    assert set(extender) <= {
        "urlPrefix", "filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb", "weight",
        "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
        "ignorable",
    }  # fmt: skip
    # A gang member's bind waits for its gang and for the previous pod on its node.
    timeout_s = int(re.fullmatch(r"(\d+)s", extender["httpTimeout"])[1])  # type: ignore[index]
    args = serve_args()
    assert timeout_s > float(args["--gang-ttl-s"]) + float(args["--hold-s"])


def test_the_extender_and_webhook_serve_the_paths_the_manifests_name() -> None:
    from agent.legacy.cluster.extender import build_extender_app

    def routes(app: Any) -> set[tuple[str, str]]:
        return {(r.method, r.resource.canonical) for r in app.router.routes()}

    extender = routes(build_extender_app(None))  # type: ignore[arg-type]
    config = scheduler_config()["extenders"][0]
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb"):
        assert ("POST", "/" + config[verb]) in extender
    webhook = routes(build_webhook_app())
    for kind, path in (("Mutating", "/mutate"), ("Validating", "/validate")):
        [hook] = find(DEPLOY / "webhook.yaml", f"{kind}WebhookConfiguration")["webhooks"]
        assert hook["clientConfig"]["service"]["path"] == path
        assert ("POST", path) in webhook
    assert ("GET", "/healthz") in webhook and ("GET", "/healthz") in extender
    probes = [container("gpushare")[p]["httpGet"] for p in ("livenessProbe", "readinessProbe")]
    assert all(p["path"] == "/healthz" and p["scheme"] == "HTTPS" for p in probes)
    for probe in ("livenessProbe", "readinessProbe"):
        assert container("kube-scheduler")[probe]["httpGet"]["path"] == "/healthz"


def test_kube_scheduler_reads_the_configuration_mounted_for_it() -> None:
    scheduler = container("kube-scheduler")
    [flag] = [a for a in scheduler["args"] if a.startswith("--config=")]
    path = flag.removeprefix("--config=")
    mounts = {m["mountPath"]: m for m in scheduler["volumeMounts"]}
    assert path == "/etc/kubernetes/gpushare-scheduler.yaml" and path in mounts
    volume = next(
        v for v in scheduler_pod()["spec"]["volumes"] if v["name"] == mounts[path]["name"]
    )
    assert volume["configMap"]["name"] == "gpushare-scheduler-config"
    assert mounts[path]["subPath"] == "gpushare-scheduler.yaml"
    assert scheduler["image"].rpartition(":")[0].endswith("/kube-scheduler")


# -- gpushare kube serve -----------------------------------------------------------------


def test_kube_serve_is_given_only_its_own_options() -> None:
    args = serve_args()
    assert set(args) <= KUBE_SERVE_OPTIONS, set(args) - KUBE_SERVE_OPTIONS
    assert "--insecure-agents" not in args  # the shipped manifests use TLS to the agents
    for needed in ("--agent-ca", "--agent-cert", "--agent-key", "--agent-token-file"):
        assert args.get(needed), needed
    assert args["--webhook-listen"] and args["--webhook-cert"] and args["--webhook-key"]


def test_kube_serve_accepts_the_arguments_of_the_manifest() -> None:
    """Click parses every option before the eager --help exits: an unknown one fails."""
    gpushare = BIN / "gpushare"
    help_text = subprocess.run(
        [str(gpushare), "kube", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if help_text.returncode != 0:
        pytest.skip(f"gpushare kube serve is not available: {help_text.stderr.strip()}")
    for option in serve_args():
        assert option in help_text.stdout, option
    done = subprocess.run(
        [str(gpushare), *container("gpushare")["args"], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_every_file_kube_serve_reads_is_mounted_from_a_secret_that_is_made() -> None:
    pod = scheduler_pod()["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container("gpushare")["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    made = {find(DEPLOY / "certificates.yaml", "Certificate", n)["spec"]["secretName"]
            for n in ("gpushare-webhook-tls", "gpushare-scheduler-agent-tls")}  # fmt: skip
    made.add(find(REPO / "daemonset" / "secret.yaml", "Secret")["metadata"]["name"])
    up = (KIND / "up.sh").read_text()
    for option, path in serve_args().items():
        if not option.endswith(("-ca", "-cert", "-key", "-file")):
            continue
        [name] = [n for n, m in mounts.items() if path.startswith(m + "/")]
        secret = volumes[name]["secret"]
        assert secret["secretName"] in made, secret
        assert secret["defaultMode"] == 0o440  # read by the pod's fsGroup, nobody else
        assert f"secret {secret['secretName']} " in up, f"up.sh does not make {secret}"
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]


def test_kube_serve_holds_binds_as_long_as_the_agents_wait_for_allocate() -> None:
    for configmap in (REPO / "daemonset" / "configmap.yaml", KIND / "agent-config.yaml"):
        config = yaml.safe_load(find(configmap, "ConfigMap")["data"]["config.yaml"])
        assert float(serve_args()["--hold-s"]) == float(config["kubelet"]["hold_s"]), configmap


# -- ports and services --------------------------------------------------------------------


def test_the_ports_agree_between_service_container_webhooks_and_policies() -> None:
    service = find(DEPLOY / "webhook.yaml", "Service", "gpushare-webhook")
    [port] = service["spec"]["ports"]
    ports = {p["name"]: p["containerPort"] for p in container("gpushare")["ports"]}
    assert port["targetPort"] in ports
    assert ports[port["targetPort"]] == port_of(serve_args()["--webhook-listen"])
    labels = scheduler_pod()["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        [hook] = find(DEPLOY / "webhook.yaml", kind)["webhooks"]
        target = hook["clientConfig"]["service"]
        assert (target["name"], target["namespace"], target["port"]) == (
            service["metadata"]["name"],
            service["metadata"]["namespace"],
            port["port"],
        )
    agents = find(REPO / "daemonset" / "service.yaml", "Service", serve_args()["--agents-service"])
    assert agents["metadata"]["namespace"] == serve_args()["--agents-namespace"]
    assert agents["spec"]["clusterIP"] == "None"
    grpc = {p["name"]: p["port"] for p in agents["spec"]["ports"]}[GRPC_PORT_NAME]
    policies = {d["metadata"]["name"]: d["spec"] for d in documents(DEPLOY / "networkpolicy.yaml")}
    ingress = policies["gpushare-scheduler"]["ingress"]
    assert [p["port"] for rule in ingress for p in rule["ports"]] == [ports[port["targetPort"]]]
    to_agents = policies["gpushare-scheduler"]["egress"][0]
    assert to_agents["to"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gpushare-agent"
    }
    assert [p["port"] for p in to_agents["ports"]] == [grpc]
    from_scheduler = policies["gpushare-agent-from-scheduler"]["ingress"][0]
    assert from_scheduler["from"][0]["podSelector"]["matchLabels"].items() <= labels.items()
    assert [p["port"] for p in from_scheduler["ports"]] == [grpc]


# -- the webhook configurations ------------------------------------------------------------


def test_the_webhooks_fail_closed_on_share_pods_only_and_skip_the_system() -> None:
    certificate = find(DEPLOY / "certificates.yaml", "Certificate", "gpushare-webhook-tls")
    service = find(DEPLOY / "webhook.yaml", "Service", "gpushare-webhook")["metadata"]
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    for kind, operations, resources in (
        ("MutatingWebhookConfiguration", ["CREATE"], ["pods"]),
        (
            "ValidatingWebhookConfiguration",
            ["CREATE", "UPDATE"],
            ["pods", "pods/ephemeralcontainers"],
        ),
    ):
        configuration = find(DEPLOY / "webhook.yaml", kind)
        injected = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert injected == f"{NAMESPACE}/{certificate['metadata']['name']}"
        [hook] = configuration["webhooks"]
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None" and hook["failurePolicy"] == "Fail"
        assert "caBundle" not in hook["clientConfig"]  # injected; an apply must not wipe it
        [rule] = hook["rules"]
        assert rule["operations"] == operations and rule["resources"] == resources
        assert rule["apiGroups"] == [""] and rule["apiVersions"] == ["v1"]
        [excluded] = hook["namespaceSelector"]["matchExpressions"]
        assert excluded["key"] == "kubernetes.io/metadata.name"
        assert excluded["operator"] == "NotIn"
        assert set(excluded["values"]) == {NAMESPACE, "kube-system"}
        [condition] = hook["matchConditions"]
        for needle in ("'gpushare.io/'", f"'{RESOURCE}'", "initContainers", "limits", "requests"):
            assert needle in condition["expression"], needle


def test_the_example_pod_passes_the_webhook_and_gets_the_scheduler_and_finalizer() -> None:
    [pod] = [d for d in documents(KIND / "example-pod.yaml") if d["kind"] == "Pod"]
    check_new_pod(pod)
    ask = parse_ask(pod)
    assert (ask.memory_bytes, ask.thread_pct, ask.shares) == (2 * 2**30, 25.0, 1)
    patch = {op["path"]: op["value"] for op in mutation(pod)}
    assert patch == {"/spec/schedulerName": SCHEDULER_NAME, "/metadata/finalizers": [FINALIZER]}
    [demo] = pod["spec"]["containers"]
    assert demo["resources"]["limits"] == {RESOURCE: 1}
    assert "CUDA_MPS|NVIDIA_VISIBLE|GPUSHARE" in demo["command"][-1]
    assert pod["metadata"]["namespace"] not in (NAMESPACE, "kube-system")


# -- RBAC ------------------------------------------------------------------------------------


def port_methods_in_use() -> set[str]:
    """The KubeApi methods some part of the agent calls (outside the port and its adapter)."""
    tree = ast.parse((REPO / "agent" / "kubeapi" / "port.py").read_text())
    [port] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KubeApi"]
    methods = {n.name for n in port.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)}
    used: set[str] = set()
    for path in (REPO / "agent").rglob("*.py"):
        if path.parent.name == "kubeapi" and path.name != "leader.py":  # the port, its adapter
            continue
        if path.parent.name == "dracontrol":  # the DRA path's controller: its own role
            continue
        text = path.read_text()
        used |= {m for m in methods if re.search(rf"\.{m}\(", text)}
    return used - {"aclose"}


def granted(documents_: list[dict[str, Any]], kind: str, name: str) -> set[tuple[str, str, str]]:
    [role] = [d for d in documents_ if d["kind"] == kind and d["metadata"]["name"] == name]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_gpushare_rules_grant_exactly_the_calls_the_code_makes() -> None:
    calls = rest_calls()
    used = port_methods_in_use()
    assert used <= set(calls), f"port methods without a known API call: {used - set(calls)}"
    needed = set().union(*(calls[m] for m in used))
    rbac = documents(DEPLOY / "rbac.yaml")
    cluster = granted(rbac, "ClusterRole", "gpushare-scheduler")
    local = granted(rbac, "Role", "gpushare-scheduler")
    assert cluster | local == needed, (
        f"granted, not used: {(cluster | local) - needed}; used, not granted: "
        f"{needed - (cluster | local)}"
    )
    assert {(g, r) for g, r, _ in local} <= NAMESPACED
    assert not {(g, r) for g, r, _ in cluster} & NAMESPACED
    assert all("*" not in item for grant in cluster | local for item in grant)


def test_every_binding_names_the_scheduler_account_and_a_known_role() -> None:
    rbac = documents(DEPLOY / "rbac.yaml")
    [account] = [d for d in rbac if d["kind"] == "ServiceAccount"]
    assert scheduler_pod()["spec"]["serviceAccountName"] == account["metadata"]["name"]
    ours = {
        (d["kind"], d["metadata"]["name"]) for d in rbac if d["kind"] in ("Role", "ClusterRole")
    }
    for binding in (d for d in rbac if d["kind"].endswith("Binding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
        ]
        role = (binding["roleRef"]["kind"], binding["roleRef"]["name"])
        assert role in ours | BUILT_IN_ROLES, role
        if role[1] == "extension-apiserver-authentication-reader":
            assert binding["metadata"]["namespace"] == "kube-system"
    election = granted(rbac, "Role", "gpushare-scheduler-leader-election")
    assert {r for _, r, _ in election} == {"leases"}
    [named] = [
        rule
        for d in rbac
        if d["metadata"]["name"] == "gpushare-scheduler-leader-election" and d["kind"] == "Role"
        for rule in d["rules"]
        if rule.get("resourceNames")
    ]
    assert named["resourceNames"] == [scheduler_config()["leaderElection"]["resourceName"]]
