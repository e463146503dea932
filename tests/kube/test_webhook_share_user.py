"""The admission webhook and the share's user: a pod with a GPU share states the one UID
its share runs as (``runAsUser``), unless ``kube serve --run-as-user optional``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from agent.core.podusers import FIX
from agent.legacy.cluster.annotations import FINALIZER
from agent.legacy.cluster.webhook import build_webhook_app
from tests.kube.webhook_reviews import (
    Pod,
    Webhook,
    annotate,
    apply_patch,
    changed,
    container,
    debug_container,
    debugged,
    patch_of,
    review,
    security,
    served,
    update,
)

NOT_STATED = "the GPU share's user is not stated: " + FIX


def run_as(pod_uid: object = None, **container_uids: object) -> Callable[[Pod], object]:
    """The pod's runAsUser (None: unset) and its containers', by name (a container named
    here and not in the pod is added without a share, ``<name>-share`` with a share of 0)."""

    def change(pod: Pod) -> None:
        pod["spec"]["securityContext"] = {} if pod_uid is None else {"runAsUser": pod_uid}
        for name, uid in container_uids.items():
            found = [c for c in pod["spec"]["containers"] if c["name"] == name]
            if not found:
                share = {"gpushare.io/share": "0"} if name.endswith("-share") else {"cpu": "1"}
                found = [container(name, resources={"limits": share})]
                pod["spec"]["containers"].extend(found)
            if uid is not None:
                found[0]["securityContext"] = {"runAsUser": uid}

    return change


def share_init_container(uid: object = None) -> Callable[[Pod], object]:
    """The share asked by an init container (the main container asks none)."""

    def change(pod: Pod) -> None:
        pod["spec"]["securityContext"] = {}
        pod["spec"]["containers"] = [container(share=False, securityContext={"runAsUser": 1000})]
        pod["spec"]["initContainers"] = [
            container("setup", **({} if uid is None else {"securityContext": {"runAsUser": uid}}))
        ]

    return change


USER_REFUSED: list[tuple[str, Callable[[Pod], object], str]] = [
    ("no runAsUser", run_as(None),
     f"spec.containers[0].securityContext.runAsUser: {NOT_STATED}"),
    ("a runAsUser of -1", run_as(-1), "spec.containers[0].securityContext.runAsUser: the GPU"),
    ("a runAsUser over the range", run_as(2**32 - 1), "spec.containers[0].securityContext"),
    ("a runAsUser as a string", run_as("1000"), "spec.containers[0].securityContext"),
    ("a runAsUser of true", run_as(True), "spec.containers[0].securityContext"),
    ("a container's unreadable one hides the pod's", run_as(1000, train=-5),
     "spec.containers[0].securityContext.runAsUser: the GPU"),
    ("two UIDs in one share", run_as(1000, **{"aux-share": 2000}),
     "spec.containers[1].securityContext.runAsUser: is 2000, but spec.containers[0] runs as "
     "1000: a share has one user; " + FIX),
    ("a second share container without one", run_as(None, train=1000, **{"aux-share": None}),
     f"spec.containers[1].securityContext.runAsUser: {NOT_STATED}"),
    ("an init container's share without one", share_init_container(),
     f"spec.initContainers[0].securityContext.runAsUser: {NOT_STATED}"),
    ("an init container's share of another UID than the main share",
     lambda p: (share_init_container(1000)(p), p["spec"]["containers"].append(container(
         "main-share", resources={"limits": {"gpushare.io/share": "0"}},
         securityContext={"runAsUser": 2000}))),
     "spec.containers[1].securityContext.runAsUser: is 2000, but spec.initContainers[0] runs"),
]  # fmt: skip

USER_ALLOWED: list[tuple[str, Callable[[Pod], object]]] = [
    ("the pod's only", run_as(1000)),
    ("root", run_as(0)),
    ("the largest UID", run_as(2**32 - 2)),
    ("the container's only", run_as(None, train=1000)),
    ("the container overrides the pod's", run_as(1000, train=2000)),
    ("a sidecar without a share may run as another", run_as(1000, sidecar=2000)),
    ("a sidecar without a share need not say", run_as(None, train=1000, sidecar=None)),
    ("two share containers of one UID", run_as(None, train=1000, **{"aux-share": 1000})),
    ("an init container's share", share_init_container(1000)),
]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("change", "message"), [r[1:] for r in USER_REFUSED], ids=[r[0] for r in USER_REFUSED]
)
async def test_a_share_states_its_one_user(
    webhook: Webhook, path: str, change: Callable[[Pod], object], message: str
) -> None:
    response = await webhook.admit(path, review(changed(change)))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["message"].startswith(message), response["status"]["message"]


@pytest.mark.parametrize("change", [a[1] for a in USER_ALLOWED], ids=[a[0] for a in USER_ALLOWED])
async def test_the_share_user_near_misses(
    webhook: Webhook, change: Callable[[Pod], object]
) -> None:
    pod = changed(change)
    mutated = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    assert (await webhook.admit("/validate", review(mutated)))["allowed"] is True


async def test_an_annotation_only_pod_is_refused_for_its_missing_share(webhook: Webhook) -> None:
    """A pod that asks by annotation only: its share request is what it must fix first."""
    pod = changed(lambda p: p["spec"].update(containers=[container(share=False)]))
    pod["spec"]["securityContext"] = {}
    response = await webhook.admit("/validate", review(pod))
    assert response["status"]["message"].startswith("gpushare.io/share: no container requests")


@pytest.fixture
async def optional_user() -> AsyncIterator[Webhook]:
    """The webhook of ``kube serve --run-as-user optional``."""
    async with served(build_webhook_app(require_user=False)) as client:
        yield client


@pytest.mark.parametrize("change", [r[1] for r in USER_REFUSED], ids=[r[0] for r in USER_REFUSED])
async def test_with_the_user_optional_those_pass(
    optional_user: Webhook, change: Callable[[Pod], object]
) -> None:
    pod = changed(change)
    mutated = apply_patch(pod, patch_of(await optional_user.admit("/mutate", review(pod))))
    assert (await optional_user.admit("/validate", review(mutated)))["allowed"] is True
    refused = await optional_user.admit(
        "/validate", review(changed(security({"privileged": True})))
    )
    assert refused["allowed"] is False  # the other rules hold


async def test_a_pod_from_before_the_rule_may_still_change_and_go(webhook: Webhook) -> None:
    """runAsUser cannot change on a pod: one admitted before the rule keeps its other ways
    (a pending pod's new ask, the finalizer dropped, a debug container)."""
    old = changed(run_as(None))
    old["metadata"].update(uid=str(uuid.uuid4()), finalizers=[FINALIZER], resourceVersion="7")
    good = update(old, annotate(**{"gpushare.io/threads": "50"}))
    assert (await webhook.admit("/validate", good))["allowed"] is True
    gone = update(old, lambda p: p["metadata"].update(finalizers=[]))
    assert (await webhook.admit("/validate", gone))["allowed"] is True
    assert (await webhook.admit("/validate", debugged(old, debug_container())))["allowed"]
