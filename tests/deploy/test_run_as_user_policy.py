"""The admission policies that make a GPU-share pod state the user it runs as
(values runAsUserPolicy; chart templates/policy/_run-as-user.tpl), and the DRA path's slice
policy: their CEL is evaluated here, as the API server evaluates a ValidatingAdmissionPolicy,
on sample pods and requests, with the pure-Python CEL evaluator cel-python (``celpy``).

The evaluation (tests/deploy/cel.py) is the API server's: matchConstraints, the binding's
namespaceSelector, matchConditions, variables, validations; an evaluation error fails the
test (with failurePolicy Fail it would refuse the request).

The policies' pods are also given to the agent's own reading (agent/core/podusers.py), and
the two must agree: refused exactly when the agent would find a share's user unstated,
naming the container the agent names first.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest

from agent.core.podusers import FIX, claim_users, users_of
from agent.legacy.cluster.annotations import share_request
from tests.deploy.cel import Policy, documents, label_selector_selects, namespace, policies
from tests.deploy.test_chart import DRA_VERSIONS, objects
from tests.deploy.test_one_gpu_policy import ONE_GPU_POLICIES
from tests.helpers import REPO

WEBHOOK = REPO / "deploy" / "webhook.yaml"  # the extender path's admission objects
SLICE_POLICY = REPO / "deploy" / "dra" / "slice-policy.yaml"  # the DRA path's
SHARE = "gpushare-share-run-as-user"
GPU = "gpushare-dra-gpu-run-as-user"
CLAIM = "gpushare-dra-claim-run-as-user"
SLICES = "gpushare-dra-own-node-slices"
# The DRA path's other policies, in the same files: tests/deploy/test_one_gpu_policy.py.
OTHERS = {SLICES, *ONE_GPU_POLICIES}
RUN_AS_USER_POLICIES = {"extender": {SHARE}, "dra": {GPU, CLAIM}, "both": {SHARE, GPU, CLAIM}}
LABEL = "gpushare.io/run-as-user"  # runAsUserPolicy.draNamespaceSelector's default label


def shipped() -> dict[str, Policy]:
    """The policies of the plain manifests (the chart rendered by deploy/render.sh)."""
    return policies(documents(WEBHOOK)) | policies(documents(SLICE_POLICY))


SHIPPED = shipped()


# -- sample pods -----------------------------------------------------------------------------


def container(
    name: str,
    *,
    share: str | None = None,  # an extended resource it asks, in limits
    requests: str | None = None,  # an extended resource it asks, in requests only
    claims: tuple[str, ...] = (),  # the pod's claims it names in resources.claims
    user: int | None = None,  # its own securityContext.runAsUser
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if share:
        resources["limits"] = {share: 1, "cpu": "1"}
    if requests:
        resources["requests"] = {requests: 1}
    if claims:
        resources["claims"] = [{"name": c} for c in claims]
    made: dict[str, Any] = {"name": name, "image": "cuda:12", "resources": resources}
    made["securityContext"] = {"allowPrivilegeEscalation": False}
    if user is not None:
        made["securityContext"]["runAsUser"] = user
    return made


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    user: int | None = None,
    claims: tuple[str, ...] = (),
    ns: str = "team-a",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    spec["securityContext"] = {"supplementalGroups": [2000]}
    if user is not None:
        spec["securityContext"]["runAsUser"] = user
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": f"claim-{c}"} for c in claims]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "job", "namespace": ns},
        "spec": spec,
    }


def uses(name: str, **kwargs: Any) -> dict[str, Any]:
    """A container that names the pod's claim ``gpu`` in resources.claims."""
    return container(name, claims=("gpu",), **kwargs)


def claimed(*containers: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A pod with the resource claim ``gpu`` (the ResourceClaim claim-gpu)."""
    return pod(*containers, claims=("gpu",), **kwargs)


def agent_unstated(policy: str, sample: dict[str, Any]) -> tuple[str, ...]:
    """The containers whose user the agent would find unstated, in its order (podusers)."""
    if policy == SHARE:
        users = users_of(sample, lambda c: share_request(c) is not None)
    elif policy == GPU:
        names = ("gpushare.io/gpu", "deviceclass.resource.kubernetes.io/gpushare.io")
        users = users_of(sample, lambda c: any(asks(c, n) for n in names))
    else:
        users = claim_users(sample, "claim-gpu")
        return tuple(u.partition("/")[2] for u in users.unstated)
    return users.unstated


def asks(container: Mapping[str, Any], resource: str) -> bool:
    resources = container.get("resources") or {}
    return any(resource in (resources.get(part) or {}) for part in ("limits", "requests"))


def expect(policy: str, sample: dict[str, Any], want: str, *, ns: dict[str, Any]) -> None:
    """``want``: "not matched", "allowed", or the refused container ("container main",
    "init container warmup"); and the agent reads the pod the same way."""
    outcome = SHIPPED[policy].admit(sample, ns=ns)
    if want == "not matched":
        assert not outcome.matched, outcome
        return
    assert outcome.matched
    unstated = agent_unstated(policy, sample)
    if want == "allowed":
        assert outcome.allowed, outcome.refusal
        assert not unstated, unstated
        return
    assert outcome.refusal is not None, f"{want} should be refused"
    assert outcome.refusal.startswith(f"{want} "), outcome.refusal
    assert outcome.refusal.endswith(f"states no user (runAsUser): {FIX}"), outcome.refusal
    assert unstated and want.endswith(f"container {unstated[0]}"), unstated


TEAM_A = namespace("team-a")


# -- the extender path: containers asking gpushare.io/share ----------------------------------

S = "gpushare.io/share"
SHARE_CASES = {
    "pod-level user": (pod(container("main", share=S), user=1000), "allowed"),
    "root at the pod is a user": (pod(container("main", share=S), user=0), "allowed"),
    "root in the container is a user": (pod(container("main", share=S, user=0)), "allowed"),
    "each share container's own": (
        pod(container("a", share=S, user=1000), container("b", share=S, user=1000)),
        "allowed",
    ),
    "the container's own beside another's unstated": (
        pod(container("a", share=S, user=1000), container("b", share=S)),
        "container b",
    ),
    "a share container with none": (pod(container("main", share=S)), "container main"),
    "asked in requests only": (pod(container("main", requests=S)), "container main"),
    "a sidecar without a share needs none": (
        pod(container("main", share=S, user=1000), container("logs")),
        "allowed",
    ),
    "an init container's share without": (
        pod(container("main", share=S, user=1000), init=(container("warmup", share=S),)),
        "init container warmup",
    ),
    "init containers are named first": (
        pod(container("main", share=S), init=(container("warmup", share=S),)),
        "init container warmup",
    ),
    "the pod's user covers an init container": (
        pod(container("main", share=S), init=(container("warmup", share=S),), user=1000),
        "allowed",
    ),
    "no share: not matched": (pod(container("main"), container("logs")), "not matched"),
    "another resource: not matched": (
        pod(container("main", share="nvidia.com/gpu")),
        "not matched",
    ),
    "a claim is not the extender's": (claimed(uses("main")), "not matched"),
}


@pytest.mark.parametrize("case", SHARE_CASES)
def test_the_share_policy_on_sample_pods(case: str) -> None:
    sample, want = SHARE_CASES[case]
    expect(SHARE, sample, want, ns=TEAM_A)


def test_the_share_policy_holds_in_every_namespace_and_on_create_only() -> None:
    policy = SHIPPED[SHARE]
    assert "matchResources" not in policy.binding["spec"]
    unstated = pod(container("main", share=S), ns="kube-system")
    assert not policy.admit(unstated, ns=namespace("kube-system")).allowed
    # securityContext of a container is immutable, ephemeral containers hold no resources
    for operation in ("UPDATE", "DELETE", "CONNECT"):
        assert not policy.admit(unstated, operation=operation, old=unstated, ns=TEAM_A).matched
    ephemeral = ("", "v1", "pods/ephemeralcontainers")
    assert not policy.admit(unstated, resource=ephemeral, ns=TEAM_A).matched


# -- the DRA path: gpushare.io/gpu, and resource claims in the selected namespaces -----------

G = "gpushare.io/gpu"
GPU_CASES = {
    "pod-level user": (pod(container("main", share=G), user=1000), "allowed"),
    "the container's own, root": (pod(container("main", share=G, user=0)), "allowed"),
    "a gpu container with none": (pod(container("main", share=G)), "container main"),
    "the class's implicit name": (
        pod(container("main", share="deviceclass.resource.kubernetes.io/gpushare.io")),
        "container main",
    ),
    "a sidecar without needs none": (
        pod(container("main", share=G, user=1000), container("logs")),
        "allowed",
    ),
    "an init container's without": (
        pod(container("main", share=G, user=7), init=(container("warmup", requests=G),)),
        "init container warmup",
    ),
    "the extender's share is not matched here": (pod(container("main", share=S)), "not matched"),
    "another class's implicit name is not matched": (
        pod(container("main", share="deviceclass.resource.kubernetes.io/other.example.com")),
        "not matched",
    ),
}


@pytest.mark.parametrize("case", GPU_CASES)
def test_the_gpu_policy_on_sample_pods(case: str) -> None:
    sample, want = GPU_CASES[case]
    expect(GPU, sample, want, ns=TEAM_A)
    assert "matchResources" not in SHIPPED[GPU].binding["spec"]  # every namespace


SELECTED = namespace("team-a", {LABEL: "required"})
CLAIM_CASES = {
    "pod-level user": (claimed(uses("main"), user=1000), "allowed"),
    "root at the pod": (claimed(uses("main"), user=0), "allowed"),
    "the claim container's own": (
        claimed(uses("main", user=1000), container("logs")),
        "allowed",
    ),
    "a claim container with none": (
        claimed(uses("main"), container("logs", user=5)),
        "container main",
    ),
    "an init container naming the claim": (
        claimed(uses("main", user=1000), init=(uses("warmup"),)),
        "init container warmup",
    ),
    "no container names the claim: the pod's user": (
        claimed(container("main"), container("logs"), user=1000),
        "allowed",
    ),
    "no container names the claim: each container's own": (
        claimed(container("main", user=1000), container("logs", user=1000)),
        "allowed",
    ),
    # a container that names no claim gets none of its devices: no MPS client, no user
    "no container names the claim: one without": (
        claimed(container("main", user=1000), container("logs")),
        "allowed",
    ),
    "no container names the claim: nobody says": (
        claimed(container("main"), init=(container("setup"),)),
        "allowed",
    ),
    "no claims: not matched": (pod(container("main")), "not matched"),
}


@pytest.mark.parametrize("case", CLAIM_CASES)
def test_the_claim_policy_on_sample_pods_in_a_selected_namespace(case: str) -> None:
    sample, want = CLAIM_CASES[case]
    expect(CLAIM, sample, want, ns=SELECTED)


def test_the_claim_message_names_the_container_that_uses_a_claim() -> None:
    assert SHIPPED[CLAIM].admit(claimed(container("main")), ns=SELECTED).refusal is None
    named = SHIPPED[CLAIM].admit(claimed(uses("main")), ns=SELECTED)
    assert named.refusal is not None
    assert named.refusal.startswith("container main uses a resource claim but states no user")


def test_the_claim_policy_holds_only_in_the_namespaces_its_selector_selects() -> None:
    """A policy cannot read a claim's device class: other drivers' pods in namespaces that
    did not ask for the rule are left alone."""
    selector = SHIPPED[CLAIM].binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {"matchLabels": {LABEL: "required"}}
    assert label_selector_selects(selector, SELECTED["metadata"]["labels"])
    for other in (namespace("team-b"), namespace("team-c", {LABEL: "optional"})):
        assert not label_selector_selects(selector, other["metadata"]["labels"])
    unstated = claimed(uses("main"))
    assert not SHIPPED[CLAIM].admit(unstated, ns=SELECTED).allowed
    assert not SHIPPED[CLAIM].admit(unstated, ns=namespace("team-b")).matched


# -- the chart's values ----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["extender", "dra", "both"])
def test_each_path_renders_its_own_policies_and_enabled_false_none(path: str) -> None:
    on = set(policies(objects({"path": path})))
    assert on - OTHERS == RUN_AS_USER_POLICIES[path]
    off = set(policies(objects({"path": path, "runAsUserPolicy": {"enabled": False}})))
    assert off == on & OTHERS


def test_the_shipped_files_carry_the_policies_of_their_path() -> None:
    assert set(policies(documents(WEBHOOK))) == {SHARE}
    assert set(policies(documents(SLICE_POLICY))) == {GPU, CLAIM} | OTHERS
    for name, policy in SHIPPED.items():
        if name in OTHERS:
            continue
        [rule] = policy.policy["spec"]["matchConstraints"]["resourceRules"]
        assert rule == {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
        }
        assert policy.policy["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpushare"


def test_the_namespace_selector_comes_from_the_values_and_every_namespace_is_said() -> None:
    values = {
        "path": "dra",
        "runAsUserPolicy": {
            "draNamespaceSelector": {
                "matchLabels": None,  # Helm merges maps: null drops the default label
                "matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}],
            }
        },
    }
    docs = objects(values)
    claim = policies(docs)[CLAIM]
    unstated = claimed(uses("main"))
    assert not claim.admit(unstated, ns=namespace("ml", {"team": "ml"})).allowed
    assert not claim.admit(unstated, ns=namespace("web", {"team": "web"})).matched
    assert not claim.admit(unstated, ns=namespace("labelled", {LABEL: "required"})).matched
    everywhere = policies(objects({"path": "dra", "runAsUserPolicy": {"draAllNamespaces": True}}))
    assert "matchResources" not in everywhere[CLAIM].binding["spec"]
    assert not everywhere[CLAIM].admit(unstated, ns=namespace("team-b")).allowed
    for version in DRA_VERSIONS:
        for doc in (claim.binding, everywhere[CLAIM].binding):
            kubernetes_validate.validate(doc, version, strict=True)


def test_an_empty_namespace_selector_is_refused_rather_than_meaning_every_namespace() -> None:
    empty = {"matchLabels": None}
    with pytest.raises(helm_python.HelmError, match="draNamespaceSelector"):
        objects({"path": "dra", "runAsUserPolicy": {"draNamespaceSelector": empty}})
    every = {"draNamespaceSelector": empty, "draAllNamespaces": True}
    docs = objects({"path": "dra", "runAsUserPolicy": every})
    assert "matchResources" not in policies(docs)[CLAIM].binding["spec"]


# -- the shipped examples pass --------------------------------------------------------------


@pytest.mark.parametrize(
    "example",
    [REPO / "deploy" / "kind" / "example-pod.yaml", REPO / "deploy" / "dra" / "example.yaml"],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_the_example_pods_pass_every_policy(example: Path) -> None:
    docs = documents(example)
    namespaces = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Namespace"}
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert pods
    for sample in pods:
        found = namespaces[sample["metadata"]["namespace"]]
        # the claim policy too, as if the namespace asked for it
        labelled = namespace(found["metadata"]["name"], {LABEL: "required"})
        for name, policy in SHIPPED.items():
            if name != SLICES:
                outcome = policy.admit(sample, ns=labelled)
                assert outcome.allowed, f"{sample['metadata']['name']}: {outcome.refusal}"


# -- the slice policy (deploy/dra/slice-policy.yaml) ----------------------------------------

AGENT = "system:serviceaccount:gpushare-system:gpushare-agent"
SLICE = ("resource.k8s.io", "v1", "resourceslices")


def resource_slice(node: str, driver: str = "gpushare.io") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        },
    }


ON_A = {"authentication.kubernetes.io/node-name": ["node-a"]}
# (operation, new slice, old slice, username, extra): "allowed", "not matched" or a phrase
# of the refusal
SLICE_CASES: dict[str, tuple[str, Any, Any, str, Any, str]] = {
    "its own node's slice": ("CREATE", resource_slice("node-a"), None, AGENT, ON_A, "allowed"),
    "another node's slice": (
        "CREATE", resource_slice("node-b"), None, AGENT, ON_A, "not for 'node-b'",
    ),
    "another driver's slice": (
        "CREATE", resource_slice("node-a", "other.example.com"), None, AGENT, ON_A,
        "may only write ResourceSlices of driver gpushare.io",
    ),
    "a token naming no node": (
        "CREATE", resource_slice("node-a"), None, AGENT, None, "token names no node",
    ),
    "an empty node name": (
        "CREATE", resource_slice("node-a"), None, AGENT,
        {"authentication.kubernetes.io/node-name": []}, "token names no node",
    ),
    "updating its own": (
        "UPDATE", resource_slice("node-a"), resource_slice("node-a"), AGENT, ON_A, "allowed",
    ),
    "moving another's to its node": (
        "UPDATE", resource_slice("node-a"), resource_slice("node-b"), AGENT, ON_A,
        "may not change or delete the ResourceSlice of node 'node-b'",
    ),
    "deleting its own": ("DELETE", None, resource_slice("node-a"), AGENT, ON_A, "allowed"),
    "deleting another's": (
        "DELETE", None, resource_slice("node-b"), AGENT, ON_A,
        "may not change or delete the ResourceSlice of node 'node-b'",
    ),
    "the kubelet is not matched": (
        "DELETE", None, resource_slice("node-b"), "system:node:node-a", None, "not matched",
    ),
    "an administrator is not matched": (
        "CREATE", resource_slice("node-b"), None, "admin", None, "not matched",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", SLICE_CASES)
def test_the_slice_policy_on_sample_requests(case: str) -> None:
    operation, new, old, username, extra, want = SLICE_CASES[case]
    outcome = SHIPPED[SLICES].admit(
        new, operation=operation, resource=SLICE, old=old, username=username, extra=extra
    )
    if want == "not matched":
        assert not outcome.matched
    elif want == "allowed":
        assert outcome.matched and outcome.allowed, outcome.refusal
    else:
        assert outcome.refusal is not None and want in outcome.refusal, outcome.refusal
