"""The admission policies that keep a container to one GPU on the DRA path (values
oneGpuPerContainerPolicy; chart templates/policy/_one-gpu.tpl): a CUDA process reaches one
MPS server and the agent runs one per GPU, so a request of class gpushare.io may ask one
device, and a container at most 1 of gpushare.io/gpu. The agent refuses more at its
binding answer (ONE_SHARE_PER_REQUEST), after placement; these refuse it when it is
written. Their CEL is evaluated here on sample claims, claim templates and pods, as the API
server would (tests/deploy/cel.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest

from agent.claims.shares import ClaimError, one_share_per_request
from tests.deploy.cel import Outcome, cel, documents, policies
from tests.deploy.dra_manifests import quiet_example
from tests.deploy.test_chart import DRA_VERSIONS, objects
from tests.helpers import REPO

SLICE_POLICY = REPO / "deploy" / "dra" / "slice-policy.yaml"  # the DRA path's admission
DEVICE_CLASS = REPO / "deploy" / "dra" / "deviceclass.yaml"
EXAMPLE = REPO / "deploy" / "dra" / "example.yaml"
CLAIMS = "gpushare-dra-claim-one-gpu"
TEMPLATES = "gpushare-dra-claim-template-one-gpu"
PODS = "gpushare-dra-gpu-one-gpu"
ONE_GPU_POLICIES = {CLAIMS, TEMPLATES, PODS}
CLASS = "gpushare.io"
GPU = "gpushare.io/gpu"  # the DeviceClass's extendedResourceName
IMPLICIT = "deviceclass.resource.kubernetes.io/gpushare.io"
WHY = "a process reaches one MPS server, so a container is served on one GPU"
CLAIM_FIX = f", but {WHY}: ask one device per request and give each container its own request"
POD_FIX = f", but {WHY}: ask 1 per container"

SHIPPED = {n: p for n, p in policies(documents(SLICE_POLICY)).items() if n in ONE_GPU_POLICIES}
RESOURCE = "resource.k8s.io"
# (the policy, the resource) of each kind of claim object
KINDS = {
    "ResourceClaim": (CLAIMS, (RESOURCE, "v1", "resourceclaims")),
    "ResourceClaimTemplate": (TEMPLATES, (RESOURCE, "v1", "resourceclaimtemplates")),
}


# -- sample claims -------------------------------------------------------------------------


def exactly(
    name: str = "gpu",
    cls: str = CLASS,
    *,
    count: int | None = None,
    mode: str | None = None,
    admin: bool | None = None,
) -> dict[str, Any]:
    """A request of ``cls`` (v1: under ``exactly``)."""
    asked: dict[str, Any] = {"deviceClassName": cls}
    if mode is not None:
        asked["allocationMode"] = mode
    if count is not None:
        asked["count"] = count
    if admin is not None:
        asked["adminAccess"] = admin
    return {"name": name, "exactly": asked}


def sub(
    name: str, cls: str = CLASS, *, count: int | None = None, mode: str | None = None
) -> dict[str, Any]:
    """A firstAvailable subrequest (no adminAccess: the API has none there)."""
    return {"name": name, **exactly(name, cls, count=count, mode=mode)["exactly"]}


def first_available(name: str, *subrequests: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": list(subrequests)}


def claim_spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}} if requests else {}


def made(kind: str, *requests: dict[str, Any], finalizers: bool = False) -> dict[str, Any]:
    """A ResourceClaim, or a ResourceClaimTemplate (its claim spec under spec.spec)."""
    spec = claim_spec(*requests)
    metadata: dict[str, Any] = {"name": "job-gpu", "namespace": "team-a"}
    if finalizers:
        metadata["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "spec": spec if kind == "ResourceClaim" else {"spec": spec},
    }


def admit_claim(
    kind: str, obj: dict[str, Any] | None, *, operation: str = "CREATE", old: Any = None
) -> Outcome:
    name, resource = KINDS[kind]
    return SHIPPED[name].admit(obj, operation=operation, resource=resource, old=old)


def expect_claim(outcome: Outcome, want: str) -> None:
    """``want``: "not matched", "allowed", or what the refusal names first ("request gpu
    asks 2 devices of class gpushare.io"); the refusal then says why."""
    if want == "not matched":
        assert not outcome.matched, outcome
    elif want == "allowed":
        assert outcome.matched and outcome.allowed, outcome.refusal
    else:
        assert outcome.refusal == want + CLAIM_FIX, outcome.refusal


# (requests, want)
CLAIM_CASES: dict[str, tuple[tuple[dict[str, Any], ...], str]] = {
    "count 1": ((exactly(count=1),), "allowed"),
    "no count (ExactCount 1, the API's default)": ((exactly(),), "allowed"),
    "ExactCount 1": ((exactly(mode="ExactCount", count=1),), "allowed"),
    "count 2": ((exactly(count=2),), "request gpu asks 2 devices of class gpushare.io"),
    "allocationMode All": (
        (exactly(mode="All"),),
        "request gpu asks every device of class gpushare.io",
    ),
    "count 2 with adminAccess": ((exactly(count=2, admin=True),), "allowed"),
    "All with adminAccess": ((exactly(mode="All", admin=True),), "allowed"),
    "count 2 with adminAccess false": (
        (exactly(count=2, admin=False),),
        "request gpu asks 2 devices of class gpushare.io",
    ),
    "another class's count 4": ((exactly(cls="gpu.example.com", count=4),), "not matched"),
    "another class's count 4 beside one of ours": (
        (exactly("other", "gpu.example.com", count=4), exactly(count=1)),
        "allowed",
    ),
    "the second request of two": (
        (exactly("first", count=1), exactly("second", count=3)),
        "request second asks 3 devices of class gpushare.io",
    ),
    "one device per request, two requests": (
        (exactly("a", count=1), exactly("b", count=1)),
        "allowed",
    ),
    "a firstAvailable subrequest of the class with count 2": (
        (first_available("gpu", sub("big", count=2), sub("small", count=1)),),
        "subrequest gpu/big asks 2 devices of class gpushare.io",
    ),
    "a firstAvailable subrequest of the class with All": (
        (first_available("gpu", sub("other", "gpu.example.com", count=4), sub("all", mode="All")),),
        "subrequest gpu/all asks every device of class gpushare.io",
    ),
    "firstAvailable: another class's count 4, then one of ours": (
        (first_available("gpu", sub("other", "gpu.example.com", count=4), sub("one", count=1)),),
        "allowed",
    ),
    "firstAvailable: another class's only": (
        (first_available("gpu", sub("other", "gpu.example.com", count=4)),),
        "not matched",
    ),
    "no requests": ((), "not matched"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CLAIM_CASES)
def test_the_claim_policies_on_sample_claims_and_templates(case: str, kind: str) -> None:
    requests, want = CLAIM_CASES[case]
    expect_claim(admit_claim(kind, made(kind, *requests)), want)


@pytest.mark.parametrize("kind", KINDS)
def test_an_update_is_checked_when_it_changes_the_spec_only(kind: str) -> None:
    """A claim's spec cannot change (the API refuses it too); a claim made before the policy
    was installed must still lose its finalizers and be deleted."""
    one, two = made(kind, exactly(count=1)), made(kind, exactly(count=2))
    expect_claim(
        admit_claim(kind, two, operation="UPDATE", old=one),
        "request gpu asks 2 devices of class gpushare.io",
    )
    expect_claim(admit_claim(kind, one, operation="UPDATE", old=one), "not matched")
    finalized = made(kind, exactly(count=2), finalizers=True)
    expect_claim(admit_claim(kind, two, operation="UPDATE", old=finalized), "not matched")
    expect_claim(admit_claim(kind, None, operation="DELETE", old=two), "not matched")


@pytest.mark.parametrize("kind", KINDS)
def test_the_claim_policies_match_every_version_as_v1_and_not_the_status(kind: str) -> None:
    name, (group, version, plural) = KINDS[kind]
    spec = SHIPPED[name].policy["spec"]
    # a request of v1beta1 (whose requests have no `exactly`) or v1beta2 arrives as v1
    assert spec["matchConstraints"]["matchPolicy"] == "Equivalent"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule == {
        "apiGroups": [group],
        "apiVersions": [version],
        "operations": ["CREATE", "UPDATE"],
        "resources": [plural],
    }
    two = made(kind, exactly(count=2))
    status = (group, version, plural + "/status")  # the scheduler's allocation
    assert not SHIPPED[name].admit(two, operation="UPDATE", old=two, resource=status).matched
    assert "matchResources" not in SHIPPED[name].binding["spec"]  # every namespace


# -- sample pods -----------------------------------------------------------------------------


def container(
    name: str = "main",
    *,
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "cuda:12", "resources": resources}


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "job", "namespace": "team-a"},
        "spec": spec,
    }


# (pod, want): "not matched", "allowed", or what the refusal names first
POD_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "gpushare.io/gpu: 1": (pod(container(limits={GPU: 1})), "allowed"),
    'gpushare.io/gpu: "1"': (pod(container(limits={GPU: "1"})), "allowed"),
    'gpushare.io/gpu: "1" in limits and requests': (
        pod(container(limits={GPU: "1"}, requests={GPU: "1"})),
        "allowed",
    ),
    'gpushare.io/gpu: "0"': (pod(container(limits={GPU: "0"})), "allowed"),
    'gpushare.io/gpu: "2"': (pod(container(limits={GPU: "2"})), "container main asks 2 " + GPU),
    "gpushare.io/gpu: 2": (pod(container(limits={GPU: 2})), "container main asks 2 " + GPU),
    "in requests only": (pod(container(requests={GPU: "3"})), "container main asks 3 " + GPU),
    "requests above limits (a hand-made pod)": (
        pod(container(limits={GPU: "1"}, requests={GPU: "2"})),
        "container main asks 2 " + GPU,
    ),
    "the implicit name with 2": (
        pod(container(limits={IMPLICIT: "2"})),
        "container main asks 2 " + IMPLICIT,
    ),
    "the implicit name with 1": (pod(container(limits={IMPLICIT: "1"})), "allowed"),
    "a CPU count beside one GPU": (
        pod(container(limits={GPU: "1", "cpu": "2", "memory": "4Gi"})),
        "allowed",
    ),
    "one each in two containers": (
        pod(container("a", limits={GPU: "1"}), container("b", limits={GPU: "1"})),
        "allowed",
    ),
    "the second container": (
        pod(container("a", limits={GPU: "1"}), container("b", limits={GPU: "4"})),
        "container b asks 4 " + GPU,
    ),
    "an init container": (
        pod(container(limits={GPU: "1"}), init=(container("warmup", limits={GPU: "2"}),)),
        "init container warmup asks 2 " + GPU,
    ),
    "init containers are named first": (
        pod(container(limits={GPU: "5"}), init=(container("warmup", limits={IMPLICIT: "2"}),)),
        "init container warmup asks 2 " + IMPLICIT,
    ),
    "other resources": (
        pod(container(limits={"nvidia.com/gpu": "4", "cpu": "8"})),
        "not matched",
    ),
    "another class's implicit name": (
        pod(container(limits={"deviceclass.resource.kubernetes.io/gpu.example.com": "4"})),
        "not matched",
    ),
    "no resources": (pod(container()), "not matched"),
}


@pytest.mark.parametrize("case", POD_CASES)
def test_the_pod_policy_on_sample_pods(case: str) -> None:
    sample, want = POD_CASES[case]
    outcome = SHIPPED[PODS].admit(sample)
    if want == "not matched":
        assert not outcome.matched, outcome
    elif want == "allowed":
        assert outcome.matched and outcome.allowed, outcome.refusal
    else:
        assert outcome.refusal == want + POD_FIX, outcome.refusal


def test_the_pod_policy_holds_in_every_namespace_and_on_create_only() -> None:
    """Extended resources cannot change in a running pod; ephemeral containers ask none."""
    policy = SHIPPED[PODS]
    assert "matchResources" not in policy.binding["spec"]
    two = pod(container(limits={GPU: "2"}))
    for operation in ("UPDATE", "DELETE", "CONNECT"):
        assert not policy.admit(two, operation=operation, old=two).matched
    assert not policy.admit(two, resource=("", "v1", "pods/ephemeralcontainers")).matched


# -- the names agree with the DeviceClass and the agent --------------------------------------


def test_the_policies_name_the_device_class_and_its_resources() -> None:
    [device_class] = documents(DEVICE_CLASS)
    assert device_class["metadata"]["name"] == CLASS
    assert device_class["spec"]["extendedResourceName"] == GPU
    [names] = [v for v in SHIPPED[PODS].policy["spec"]["variables"] if v["name"] == "names"]
    assert list(cel(names["expression"], {})) == [
        GPU,
        f"deviceclass.resource.kubernetes.io/{CLASS}",
    ]
    for name in (CLAIMS, TEMPLATES):
        text = str(SHIPPED[name].policy["spec"])
        assert f'deviceClassName == "{CLASS}"' in text


def test_the_reason_is_the_agents_own() -> None:
    """The same words as the agent's refusal at its binding answer (ONE_SHARE_PER_REQUEST)."""
    shares = [SimpleNamespace(request="gpu", device=d) for d in ("gpu-0", "gpu-1")]
    with pytest.raises(ClaimError) as refused:
        one_share_per_request(shares)  # type: ignore[arg-type]
    assert "ONE_SHARE_PER_REQUEST" in str(refused.value)
    assert WHY in str(refused.value)


# -- the chart's values and the shipped files ------------------------------------------------


@pytest.mark.parametrize("path", ["extender", "dra", "both"])
def test_the_dra_path_renders_them_and_the_switch_turns_them_off(path: str) -> None:
    on = set(policies(objects({"path": path})))
    assert (on & ONE_GPU_POLICIES) == (ONE_GPU_POLICIES if path != "extender" else set())
    off = set(policies(objects({"path": path, "oneGpuPerContainerPolicy": {"enabled": False}})))
    assert off == on - ONE_GPU_POLICIES


def test_the_shipped_policies_are_the_charts_and_valid_for_every_dra_version() -> None:
    assert set(SHIPPED) == ONE_GPU_POLICIES
    rendered = policies(objects({"path": "dra"}))
    for name, policy in SHIPPED.items():
        assert rendered[name] == policy
        assert policy.policy["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpushare"
        assert policy.policy["spec"]["failurePolicy"] == "Fail"
        assert policy.binding["spec"]["validationActions"] == ["Deny"]
        for version in DRA_VERSIONS:
            for doc in (policy.policy, policy.binding):
                kubernetes_validate.validate(doc, version, strict=True)


def test_the_dra_examples_pass() -> None:
    docs = documents(EXAMPLE)
    templates = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert templates and pods
    for template in [*templates, quiet_example()]:
        outcome = admit_claim("ResourceClaimTemplate", template)
        assert outcome.matched and outcome.allowed, outcome.refusal
    for sample in pods:
        outcome = SHIPPED[PODS].admit(sample)
        assert outcome.allowed, f"{sample['metadata']['name']}: {outcome.refusal}"
        assert outcome.matched == ("resourceClaims" not in sample["spec"])
