"""Which user a pod's containers run as (agent.core.podusers), and the DRA driver's verdict
on a claim's users (agent.claims.users.decided): tables."""

from __future__ import annotations

from typing import Any

import pytest

from agent.claims.users import decided, one_share_per_container
from agent.core.podusers import (
    FIX,
    MAX_UID,
    Users,
    claim_requests,
    claim_users,
    run_as_user,
    users_of,
)
from agent.dra.claims import ClaimError, Share


def pod(
    *containers: dict[str, Any], pod_uid: object = None, init: tuple[dict[str, Any], ...] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if pod_uid is not None:
        spec["securityContext"] = {"runAsUser": pod_uid}
    return {"metadata": {"name": "p"}, "spec": spec}


def container(name: str = "main", uid: object = None, claims: tuple[str, ...] = ()) -> dict:
    found: dict[str, Any] = {"name": name}
    if uid is not None:
        found["securityContext"] = {"runAsUser": uid}
    if claims:
        found["resources"] = {"claims": [{"name": c} for c in claims]}
    return found


@pytest.mark.parametrize(
    ("pod_uid", "own", "expected"),
    [
        (None, None, None),
        (1000, None, 1000),
        (None, 2000, 2000),
        (1000, 2000, 2000),  # the container's own wins
        (0, None, 0),  # root is a stated user
        (MAX_UID, None, MAX_UID),
        (MAX_UID + 1, None, None),
        (-1, None, None),
        (True, None, None),  # a JSON boolean is not a number
        ("1000", None, None),
        (1000, "x", None),  # a bad own value is not replaced by the pod's
    ],
)
def test_run_as_user(pod_uid: object, own: object, expected: int | None) -> None:
    one = container(uid=own)
    assert run_as_user(pod(one, pod_uid=pod_uid), one) == expected


@pytest.mark.parametrize(
    ("users", "uid"),
    [
        (Users(), None),
        (Users(frozenset({7})), 7),
        (Users(frozenset({7, 8})), None),
        (Users(frozenset({7}), ("c",)), None),
    ],
)
def test_the_one_uid(users: Users, uid: int | None) -> None:
    assert users.uid == uid


def test_init_containers_count_and_are_named() -> None:
    found = users_of(pod(container("a", 5), init=(container("setup"),)))
    assert found == Users(frozenset({5}), ("setup",))


def named(claim_name: str, pod_name: str = "gpu") -> dict[str, Any]:
    return {"name": pod_name, "resourceClaimName": claim_name}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        # only the containers that use the claim count
        ("direct", Users(frozenset({1}), ("p/b",))),
        # a claim generated from a template: its name is in the pod's status
        ("template", Users(frozenset({1}), ("p/b",))),
        # the claim of the pod's extended resources: the containers its mappings name
        ("extended", Users(frozenset({2}))),
        # the pod names the claim, no container uses it: no container gets its devices
        ("unused", Users()),
        # the pod names the claim nowhere yet (the mapping of a claim for extended
        # resources is written after it): the containers that ask the resource
        ("not named yet", Users(frozenset({2}))),
    ],
)
def test_claim_users(case: str, expected: Users) -> None:
    found = pod(
        container("a", 1, claims=("gpu",)),
        container("b", claims=("gpu",)),
        container("c", 2),
    )
    if case == "direct":
        found["spec"]["resourceClaims"] = [named("claim-x")]
    elif case == "template":
        found["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
        found["status"] = {"resourceClaimStatuses": [named("claim-x")]}
    elif case == "unused":
        found["spec"]["resourceClaims"] = [named("claim-x")]
        for c in found["spec"]["containers"]:
            c.pop("resources", None)
    elif case == "not named yet":
        found["spec"]["containers"][2]["resources"] = {"limits": {"gpushare.io/gpu": "1"}}
    elif case == "extended":
        mapping = {"containerName": "c", "resourceName": "gpushare.io/gpu", "requestName": "r"}
        found["status"] = {
            "extendedResourceClaimStatus": {
                "resourceClaimName": "claim-x",
                "requestMappings": [mapping],
            }
        }
    assert claim_users(found, "claim-x", ("gpushare.io/gpu",)) == expected


@pytest.mark.parametrize(
    ("users", "rule", "required", "answer"),
    [
        (Users(), True, True, None),  # no pod known: nothing to check
        (Users(frozenset({5})), True, True, 5),
        (Users(frozenset({5}), ("p/x",)), True, False, None),  # not required: unchecked
        (
            Users(frozenset({5}), ("p/x",)),
            True,
            True,
            "RUN_AS_USER_REQUIRED: claim ns/c: container p/x",
        ),
        (Users(unstated=("p/x", "p/y")), True, True, "containers p/x, p/y state no user"),
        (Users(unstated=tuple(f"p/{i}" for i in range(7))), True, True, "p/4 and 2 more state"),
        (Users(frozenset({5, 6})), True, True, "USER_CONFLICT: claim ns/c is used by pods of"),
        (Users(frozenset({5, 6})), True, False, "UIDs 5, 6"),  # the rule, required or not
        (Users(frozenset({5, 6})), False, False, None),  # multi-user daemons: no rule
    ],
)
def test_a_claims_users_decide(
    users: Users, rule: bool, required: bool, answer: int | str | None
) -> None:
    if answer is None or isinstance(answer, int):
        assert decided(users, "ns/c", rule=rule, required=required) == answer
        return
    with pytest.raises(ClaimError) as caught:
        decided(users, "ns/c", rule=rule, required=required)
    assert answer in str(caught.value)
    if "REQUIRED" in str(caught.value):
        assert str(caught.value).endswith(FIX)


def claimed(name: str, *entries: dict[str, str], uid: int = 1) -> dict[str, Any]:
    found = container(name, uid)
    found["resources"] = {"claims": list(entries)}
    return found


def two_request_pod(*containers: dict[str, Any]) -> dict[str, Any]:
    found = pod(*containers)
    found["spec"]["resourceClaims"] = [named("claim-x")]
    return found


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        ((claimed("a", {"name": "gpu"}),), {"a": None}),  # the whole claim
        (
            (claimed("a", {"name": "gpu", "request": "r1"}), claimed("b", {"name": "gpu"})),
            {"a": frozenset({"r1"}), "b": None},
        ),
        ((claimed("a", {"name": "other"}),), {}),  # another claim of the pod
        ((container("a", 1),), {}),  # uses no claim
    ],
)
def test_claim_requests(containers: tuple[dict[str, Any], ...], expected: dict) -> None:
    assert claim_requests(two_request_pod(*containers), "claim-x") == expected


def test_claim_requests_of_extended_resources() -> None:
    found = pod(container("a", 1), container("b", 1))
    mappings = [
        {"containerName": "a", "requestName": "r0"},
        {"containerName": "b", "requestName": "r1"},
    ]
    found["status"] = {
        "extendedResourceClaimStatus": {"resourceClaimName": "claim-x", "requestMappings": mappings}
    }
    assert claim_requests(found, "claim-x") == {"a": frozenset({"r0"}), "b": frozenset({"r1"})}


def share(request: str, device: str) -> Share:
    return Share(request, device, f"{request}-{device}", None, None)


@pytest.mark.parametrize(
    ("containers", "refused"),
    [
        # one container, the whole claim of two shares: refused, naming both GPUs
        ((claimed("a", {"name": "gpu"}),), "container p/a would be given 2 shares"),
        # each container its own request: served
        (
            (
                claimed("a", {"name": "gpu", "request": "r1"}),
                claimed("b", {"name": "gpu", "request": "r2"}),
            ),
            "",
        ),
        # one container naming both requests
        (
            (claimed("a", {"name": "gpu", "request": "r1"}, {"name": "gpu", "request": "r2"}),),
            "(gpu-0, gpu-1)",
        ),
    ],
)
def test_one_share_per_container(containers: tuple[dict[str, Any], ...], refused: str) -> None:
    shares = [share("r1", "gpu-0"), share("r2", "gpu-1")]
    found = two_request_pod(*containers)
    if not refused:
        one_share_per_container(found, "claim-x", shares)
        return
    with pytest.raises(ClaimError, match="ONE_GPU_PER_CONTAINER") as caught:
        one_share_per_container(found, "claim-x", shares)
    assert refused in str(caught.value)
