"""The chart's defaults and knobs of issue 39, checked by what they do:

- a release in another namespace than gpushare-system leads: `gpushare kube serve` and
  `gpushare dra controller`, run with the leader-election arguments the chart renders for
  namespace team-gpu, take their Lease there (the API stand-in), one the rendered Role
  allows; no rendered object names gpushare-system;
- the agents run only on nodes labelled gpushare.io/node=true, and `helm upgrade` refuses
  a render that would move them off the nodes earlier releases selected;
- the kube-scheduler image follows the cluster's version, and an offline render with
  Helm's default version is refused;
- each pod's PriorityClass is a value, or the chart's own PriorityClass;
- the MPS host pod has no limit that one OOM kill of every MPS server would come from;
- values.schema.json types every value and refuses wrong ones; NOTES.txt says what to do
  next in the release's namespace; nameOverride and namespaceOverride render a release
  whose every reference resolves;
- the agent's pod has what `gpushare doctor` reads there (the shm directory, and on the DRA
  path the RuntimeClass through its token)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

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
from tests.deploy.test_dra_manifests import allows
from tests.helpers import agent_command, subprocess_env
from tests.kube.apiserver import FakeApiServer

NAMESPACE = "team-gpu"
API_TOKEN = "chart-defaults"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
OLD_SELECTOR = {"nvidia.com/gpu.present": "true"}
NEW_SELECTOR = {"gpushare.io/node": "true"}
DAEMONSETS = ("gpushare-agent", "gpushare-mps-host")


def args_of(container: dict[str, Any]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in container["args"] if a.startswith("--") and "=" in a)


def container_of(docs: list[dict[str, Any]], kind: str, name: str, container: str) -> Any:
    return next(c for c in pod_of(docs, kind, name)["containers"] if c["name"] == container)


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


# -- 11. the schema, NOTES.txt, nameOverride and namespaceOverride ----------------------------


def test_the_schema_is_valid_and_types_every_value_of_values_yaml() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(VALUES)
    assert SCHEMA["additionalProperties"] is False
    assert set(SCHEMA["properties"]) == set(VALUES), "every top-level key, and no other"

    def typed(value: Any, schema: dict[str, Any], where: str) -> None:
        if "$ref" in schema:
            schema = SCHEMA["definitions"][schema["$ref"].rsplit("/", 1)[1]]
        assert {"type", "enum", "anyOf", "const"} & set(schema), f"{where} has no type"
        if isinstance(value, dict) and "properties" in schema:
            for key, inner in value.items():
                assert key in schema["properties"], f"{where}.{key} is not in the schema"
                typed(inner, schema["properties"][key], f"{where}.{key}")

    for key, value in VALUES.items():
        typed(value, SCHEMA["properties"][key], key)


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"path": "device-plugin"}, "/path"),
        ({"nodeSelctor": {"gpushare.io/node": "true"}}, "nodeSelctor"),
        ({"scheduler": {"version": "1.31"}}, "/scheduler/version"),
        ({"scheduler": {"verison": "v1.31.0"}}, "verison"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"certificates": {"issuer": {"kind": "Vault"}}}, "/certificates/issuer/kind"),
        ({"mpsHost": {"resources": {"limits": {"memory": "lots"}}}}, "/mpsHost/resources"),
        ({"agent": {"holdS": "thirty"}}, "/agent/holdS"),
        ({"draController": {"stallS": 60}}, "/draController/stallS"),
        ({"shm": {"size": "big"}}, "/shm/size"),
        ({"tolerations": [{"key": "k", "operator": "Maybe"}]}, "/tolerations/0/operator"),
        ({"nodeSelectorMigrated": "yes"}, "/nodeSelectorMigrated"),
        ({"telemetry": {"dcgmExporter": {"enabled": "yes"}}}, "/telemetry/dcgmExporter/enabled"),
        ({"telemetry": {"dcgmExporter": {"url": "localhost:9400"}}}, "/telemetry/dcgmExporter/url"),
        ({"telemetry": {"dcgmHostEngine": {"hots": "$(HOST_IP)"}}}, "hots"),
        ({"agentConfig": ["telemetry.source=nvml"]}, "/agentConfig"),
        ({"agentConfig": {"telemetri": {"source": "nvml"}}}, "telemetri"),
        ({"agentConfig": {"telemetry": {"sourse": "nvml"}}}, "sourse"),
        ({"agentConfig": {"telemetry": {"source": "prometheus"}}}, "/agentConfig/telemetry/source"),
        ({"agentConfig": {"estimator": {"coverage": 2}}}, "/agentConfig/estimator/coverage"),
        ({"agentConfig": {"runtime": {"lock_wait_s": [60]}}}, "/agentConfig/runtime/lock_wait_s"),
        ({"certificates": {"mode": "selfSigned"}}, "/certificates/mode"),
        ({"certificates": {"generated": {"days": "1y"}}}, "/certificates/generated/days"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else v,
)
def test_the_schema_refuses_a_wrong_value_naming_it(values: dict[str, Any], said: str) -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape(said)):
        render(values)


def notes(values: dict[str, Any], namespace: str = NAMESPACE) -> str:
    return str(
        RENDER.render_all(values, namespace=namespace, kube_version=KUBE_VERSION)["NOTES.txt"]
    )


def test_the_notes_say_the_next_three_commands_in_the_release_namespace() -> None:
    text = notes({})
    assert "kubectl label node <NODE> gpushare.io/node=true" in text
    assert f"kubectl -n {NAMESPACE} get pods -o wide -l app.kubernetes.io/part-of=gpushare" in text
    doctor = f"kubectl -n {NAMESPACE} exec <AGENT POD> -c agent -- gpushare"
    assert doctor in text and " doctor" in text.split(doctor, 1)[1].splitlines()[0]
    assert "gpushare-system" not in text
    # the doctor reads the chart's config file, as the agent does
    config = pod_of(objects(), "DaemonSet", "gpushare-agent")["containers"][0]["args"]
    assert f"--config {config[config.index('--config') + 1]} doctor" in text
    mine = notes({"nodeSelector": {"pool": "a100"}, "runtimeClassName": "nvidia-cdi"})
    assert "kubectl label node" not in mine and '{"pool":"a100"}' in mine
    assert "doctor --runtime-class nvidia-cdi" in mine
    assert "<no value>" not in text + mine


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
