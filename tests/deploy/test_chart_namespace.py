"""A release in another namespace than gpushare-system, or under another name (issue 39):
`gpushare kube serve` and `gpushare dra controller`, run with the leader-election arguments
the chart renders for namespace team-gpu, take their Lease there (the API stand-in), one
the rendered Role allows; no rendered object names gpushare-system; nameOverride and
namespaceOverride render a release whose every reference resolves."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart_values import NAMESPACE, VALUES, args_of, container_of
from tests.deploy.dra_manifests import allows
from tests.deploy.test_chart import (
    DRA_VERSIONS,
    EXTENDER_VERSIONS,
    find,
    objects,
    render,
)
from tests.helpers import agent_command, subprocess_env
from tests.kubeworld.apiserver import FakeApiServer

API_TOKEN = "chart-defaults"


# -- 2. the release's namespace, everywhere ------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def held(lease: dict[str, Any]) -> bool:
    return bool(lease.get("spec", {}).get("holderIdentity"))


LEADERS = {
    # command: (kind, name, container, its own arguments to run against the stand-in)
    "kube serve": ("Deployment", "gpushare-scheduler", "gpushare", ("--extender-listen",)),
    "dra controller": ("Deployment", "gpushare-dra-controller", "controller", ()),
}


@pytest.mark.parametrize("command", LEADERS)
async def test_the_rendered_leader_election_takes_its_lease_in_the_release_namespace(
    command: str, tmp_path: Path
) -> None:
    """Run with the chart's leader-election arguments for a release in team-gpu, the real
    command takes the Lease in team-gpu (not its default gpushare-system), under a name the
    rendered Role of that namespace lets it get and update."""
    kind, name, container_name, extra = LEADERS[command]
    docs = objects({"path": "both"}, namespace=NAMESPACE)
    container = container_of(docs, kind, name, container_name)
    election = [a for a in container["args"] if a.startswith("--leader-elect")]
    options = args_of(container)
    assert options["--leader-elect-namespace"] == NAMESPACE
    (tmp_path / "api-token").write_text(API_TOKEN)
    (tmp_path / "agent-token").write_text("agents")
    own = [f"{flag}=127.0.0.1:{free_port()}" for flag in extra]
    log = tmp_path / "command.log"
    async with FakeApiServer(token=API_TOKEN) as api:
        with log.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                *agent_command(*command.split()),
                f"--api-server={api.url}",
                f"--api-token-file={tmp_path / 'api-token'}",
                "--insecure-agents",
                f"--agent-token-file={tmp_path / 'agent-token'}",
                *own,
                *election,
                "--leader-elect-retry-period-s=0.2",
                "--leader-elect-renew-deadline-s=1",
                "--leader-elect-lease-duration-s=2",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=stderr,
                env=subprocess_env(),
            )
        try:
            async with asyncio.timeout(30):
                while not [lease for lease in api.objects("leases") if held(lease)]:
                    assert process.returncode is None, log.read_text()
                    await asyncio.sleep(0.1)
        finally:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            await asyncio.wait_for(process.wait(), 30)
        [lease] = api.objects("leases")
    assert lease["metadata"]["namespace"] == NAMESPACE
    assert not held(lease)  # and given back at its clean stop
    role = next(
        d
        for d in docs
        if d["kind"] == "Role"
        and d["metadata"]["namespace"] == NAMESPACE
        and d["metadata"]["name"] == find(docs, "RoleBinding", name)["roleRef"]["name"]
    )
    lease_name = lease["metadata"]["name"]
    for verb in ("create", "get", "update"):
        assert allows(role["rules"], "coordination.k8s.io", "leases", verb, lease_name), verb


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)
    elif isinstance(node, str):
        yield node


@pytest.mark.parametrize("path", ["extender", "dra", "both"])
def test_no_object_names_a_namespace_but_the_release_one(path: str) -> None:
    docs = objects({"path": path}, namespace=NAMESPACE)
    for doc in docs:
        where = doc["metadata"].get("namespace")
        assert where in (None, NAMESPACE, "kube-system"), (doc["kind"], where)
        if where == "kube-system":  # kube-scheduler's authentication reader, by its design
            assert doc["kind"] == "RoleBinding"
        for text in strings(doc):
            assert "gpushare-system" not in text, (doc["kind"], doc["metadata"]["name"], text)
    for doc in docs:
        for subject in doc.get("subjects", []):
            assert subject["namespace"] == NAMESPACE


# -- 11. nameOverride and namespaceOverride ---------------------------------------------------

# The objects that keep their names whatever nameOverride says (templates/_helpers.tpl):
# besides these, the ones named by values (certificates.*) and the hooks' (templates/hooks).
FIXED_NAMES = {
    ("DeviceClass", "gpushare.io"),
}


# What a pod may name that the chart does not make (with the default values): Kubernetes
# makes this ConfigMap in every namespace (the API server's CA, for projected tokens).
NOT_RENDERED = {("ConfigMap", "kube-root-ca.crt")}


def pod_references(spec: dict[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of every ConfigMap, Secret and ServiceAccount a pod spec names: its
    service account, volumes (projected ones too), env and envFrom, image pull secrets."""
    found = {("ServiceAccount", spec.get("serviceAccountName", "default"))}
    for volume in spec.get("volumes", []):
        sources = [volume, *volume.get("projected", {}).get("sources", [])]
        for source in sources:
            if "configMap" in source:
                found.add(("ConfigMap", source["configMap"]["name"]))
            if "secret" in source:
                found.add(
                    ("Secret", source["secret"].get("secretName") or source["secret"]["name"])
                )
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        for env in container.get("env", []):
            ref = env.get("valueFrom", {})
            if "configMapKeyRef" in ref:
                found.add(("ConfigMap", ref["configMapKeyRef"]["name"]))
            if "secretKeyRef" in ref:
                found.add(("Secret", ref["secretKeyRef"]["name"]))
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                found.add(("ConfigMap", source["configMapRef"]["name"]))
            if "secretRef" in source:
                found.add(("Secret", source["secretRef"]["name"]))
    found |= {("Secret", s["name"]) for s in spec.get("imagePullSecrets", [])}
    return found


@pytest.mark.parametrize("path", ["extender", "dra", "both"])
def test_a_name_and_namespace_override_render_a_release_whose_references_resolve(
    path: str,
) -> None:
    values = {"path": path, "nameOverride": "gpu", "namespaceOverride": "team-gpu"}
    docs = objects(values, namespace="ignored")
    hooks = {
        (d["kind"], d["metadata"]["name"])
        for template, text in render(values, namespace="ignored").items()
        if template.startswith("hooks/")
        for d in yaml.safe_load_all(text)
        if d
    }
    by_values = set(VALUES["certificates"]["secrets"].values()) | {
        VALUES["certificates"]["issuer"]["name"]
    }
    versions = EXTENDER_VERSIONS if path == "extender" else DRA_VERSIONS
    named = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for doc in docs:
        if doc["apiVersion"] != "cert-manager.io/v1":
            for version in versions:
                kubernetes_validate.validate(doc, version, strict=True)
        kind, name = doc["kind"], doc["metadata"]["name"]
        assert doc["metadata"].get("namespace") in (None, "team-gpu", "kube-system"), name
        if name.startswith("gpushare") and "AdmissionPolicy" not in kind:
            assert (kind, name) in FIXED_NAMES | hooks or name in by_values, (kind, name)
    made_secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"} | {
        d["spec"]["secretName"] for d in docs if d["kind"] == "Certificate"
    }
    accounts = {n for k, n in named if k == "ServiceAccount"}
    pods = {
        (d["kind"], d["metadata"]["name"]): d["spec"]["template"]
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment")
    }
    hook_pods = {
        (d["kind"], d["metadata"]["name"]): d["spec"]["template"]
        for template, text in render(values, namespace="ignored").items()
        if template.startswith("hooks/")
        for d in yaml.safe_load_all(text)
        if d and d["kind"] == "Job"
    }
    made = {(k, n) for k, n in named} | {("Secret", n) for n in made_secrets} | hooks
    for (_kind, name), template in {**pods, **hook_pods}.items():
        for reference in pod_references(template["spec"]):
            assert reference in made | NOT_RENDERED, (name, reference)
    for (_kind, name), template in pods.items():
        assert (
            name.startswith("gpu-")
            and template["metadata"]["labels"]["app.kubernetes.io/name"] == name
        )
    labels = [t["metadata"]["labels"] for t in pods.values()]

    def selects(selector: dict[str, str]) -> bool:
        return any(selector.items() <= pod.items() for pod in labels)

    for doc in docs:
        if doc["kind"] == "Service":
            assert selects(doc["spec"]["selector"]), doc["metadata"]["name"]
        if doc["kind"] == "NetworkPolicy":
            assert selects(doc["spec"]["podSelector"]["matchLabels"])
            for rule in doc["spec"].get("ingress", []) + doc["spec"].get("egress", []):
                for peer in rule.get("from", []) + rule.get("to", []):
                    if "podSelector" in peer:
                        assert selects(peer["podSelector"]["matchLabels"])
        if doc["kind"].endswith("Binding") and "AdmissionPolicy" not in doc["kind"]:
            ref = doc["roleRef"]
            builtin = ref["name"].startswith(("system:", "extension-apiserver"))
            assert builtin or (ref["kind"], ref["name"]) in named, ref
            for subject in doc["subjects"]:
                assert subject["name"] in accounts and subject["namespace"] == "team-gpu"
    agent_names = find(docs, "Certificate", "gpushare-agent-tls")["spec"]["dnsNames"]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
    for kind, name, container, role, lease in (
        ("Deployment", "gpu-scheduler", "gpushare", "gpu-scheduler", "--leader-elect-lease"),
        ("Deployment", "gpu-dra-controller", "controller", "gpu-dra-controller",
         "--leader-elect-lease"),
    ):  # fmt: skip
        if (kind, name) not in pods:
            continue
        options = args_of(container_of(docs, kind, name, container))
        assert ("Service", options["--agents-service"]) in named
        assert options["--agents-namespace"] == options["--leader-elect-namespace"] == "team-gpu"
        assert options["--agent-server-name"] in agent_names
        assert allows(roles[role]["rules"], "coordination.k8s.io", "leases", "update",
                      options[lease])  # fmt: skip
    if ("Deployment", "gpu-scheduler") in pods:
        config = yaml.safe_load(
            find(docs, "ConfigMap", "gpu-scheduler-config")["data"]["gpushare-scheduler.yaml"]
        )
        election = config["leaderElection"]
        assert election["resourceNamespace"] == "team-gpu"
        assert allows(roles["gpu-scheduler-leader-election"]["rules"], "coordination.k8s.io",
                      "leases", "update", election["resourceName"])  # fmt: skip
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            [hook] = find(docs, kind)["webhooks"]
            target = hook["clientConfig"]["service"]
            assert ("Service", target["name"]) in named and target["namespace"] == "team-gpu"
    if path == "both":
        policy = find(docs, "ValidatingAdmissionPolicy", "gpu-dra-own-node-slices")
        assert "system:serviceaccount:team-gpu:gpu-agent" in str(policy["spec"])
