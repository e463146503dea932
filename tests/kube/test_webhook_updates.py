"""The admission webhook on updates of a pod: a bound pod keeps its ask and its lease, a
pending one may change its ask within the rules, the finalizer may always go; and the
ephemeral containers ``kubectl debug`` adds to a share pod keep the rules."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kube.webhook_reviews import (
    Pod,
    Webhook,
    admitted,
    annotate,
    debug_container,
    debugged,
    first,
    plain_pod,
    review,
    update,
)


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
async def test_a_bound_pod_keeps_its_ask(webhook: Webhook, path: str) -> None:
    old = admitted(node="gpu-node-1")
    for name, value in [("threads", "50"), ("memory", "40Gi"), ("priority", "guaranteed")]:
        response = await webhook.admit(
            path, update(old, annotate(**{f"gpushare.io/{name}": value}))
        )
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert response["status"]["message"].startswith(
            f"gpushare.io/{name}: cannot change on a pod bound to node 'gpu-node-1'"
        )
    removed = update(old, lambda p: p["metadata"]["annotations"].pop("gpushare.io/threads"))
    assert (await webhook.admit(path, removed))["status"]["message"].startswith(
        "gpushare.io/threads: cannot change"
    )
    added = update(old, annotate(**{"gpushare.io/gang": "late", "gpushare.io/gang-size": "2"}))
    assert (await webhook.admit(path, added))["allowed"] is False


async def test_a_bound_pod_keeps_its_lease(webhook: Webhook) -> None:
    old = admitted(node="gpu-node-1")
    response = await webhook.admit("/validate", update(old, annotate(**{
        "gpushare.io/lease": "lease-of-another"})))  # fmt: skip
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("gpushare.io/lease: cannot change")


async def test_a_pending_pod_may_change_its_ask_within_the_rules(webhook: Webhook) -> None:
    old = admitted()
    good = update(old, annotate(**{"gpushare.io/threads": "50"}))
    assert (await webhook.admit("/validate", good))["allowed"] is True
    bad = await webhook.admit("/validate", update(old, annotate(**{"gpushare.io/threads": "0"})))
    assert bad["allowed"] is False
    assert bad["status"]["code"] == 400
    assert bad["status"]["message"].startswith("gpushare.io/threads: must be a number")


async def test_the_binder_may_write_the_lease_before_binding(webhook: Webhook) -> None:
    old = admitted()
    response = await webhook.admit("/validate", update(old, annotate(**{
        "gpushare.io/lease": "l-1"})))  # fmt: skip
    assert response["allowed"] is True


async def test_updates_that_leave_the_ask_alone_pass(webhook: Webhook) -> None:
    """The controller must always be able to drop its finalizer, even from a pod admitted
    before a rule existed (here: privileged, and with an ask that no longer parses)."""
    old = admitted(node="gpu-node-1")
    old["metadata"]["annotations"]["gpushare.io/threads"] = "0"
    first(old)["securityContext"] = {"privileged": True}
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    def drop_finalizer(pod: Pod) -> None:
        pod["metadata"]["finalizers"] = []
        pod["metadata"]["labels"]["seen"] = "yes"

    for path in ("/validate", "/mutate"):
        response = await webhook.admit(path, update(old, drop_finalizer))
        assert response == {"uid": response["uid"], "allowed": True}


async def test_status_updates_and_deletes_pass(webhook: Webhook) -> None:
    old = admitted(node="gpu-node-1")
    status = update(old, annotate(**{"gpushare.io/threads": "99"}))
    status["request"]["subResource"] = "status"
    assert (await webhook.admit("/validate", status))["allowed"] is True
    deleting = review(None, operation="DELETE", old=old)
    assert (await webhook.admit("/validate", deleting))["allowed"] is True


EPHEMERAL_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("privileged", debug_container(securityContext={"privileged": True}),
     "spec.ephemeralContainers[0].securityContext.privileged: "),
    ("SYS_PTRACE", debug_container(securityContext={"capabilities": {"add": ["SYS_PTRACE"]}}),
     "spec.ephemeralContainers[0].securityContext.capabilities.add[0]: "),
    ("CUDA_MPS_", debug_container(env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp"}]),
     "spec.ephemeralContainers[0].env[0].name: 'CUDA_MPS_PIPE_DIRECTORY'"),
    ("NVIDIA_VISIBLE_DEVICES", debug_container(env=[{"name": "NVIDIA_VISIBLE_DEVICES",
                                                     "value": "all"}]),
     "spec.ephemeralContainers[0].env[0].name: 'NVIDIA_VISIBLE_DEVICES'"),
    ("envFrom prefix", debug_container(envFrom=[{"prefix": "GPUSHARE_",
                                                 "configMapRef": {"name": "c"}}]),
     "spec.ephemeralContainers[0].envFrom[0].prefix: "),
    ("envFrom without a prefix", debug_container(envFrom=[{"configMapRef": {"name": "gpu-all"}}]),
     "spec.ephemeralContainers[0].envFrom[0].prefix: a pod with a GPU share may not load"),
]  # fmt: skip


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
@pytest.mark.parametrize(
    ("added", "message"), [e[1:] for e in EPHEMERAL_REFUSED], ids=[e[0] for e in EPHEMERAL_REFUSED]
)
async def test_ephemeral_containers_of_a_share_pod_keep_the_rules(
    webhook: Webhook, path: str, added: dict[str, Any], message: str
) -> None:
    for old in (admitted(), admitted(node="gpu-node-1")):
        response = await webhook.admit(path, debugged(old, added))
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert response["status"]["message"].startswith(message), response["status"]["message"]
        assert "patch" not in response


async def test_a_plain_debug_container_may_be_added(webhook: Webhook) -> None:
    old = admitted(node="gpu-node-1")
    assert (await webhook.admit("/validate", debugged(old, debug_container())))["allowed"]
    # one added before the rule existed does not block the next: only the new one is judged
    old["spec"]["ephemeralContainers"] = [
        debug_container("old", securityContext={"privileged": True})
    ]
    again = debugged(old, debug_container("debugger-2"))
    assert (await webhook.admit("/validate", again))["allowed"] is True
    refused = debugged(old, debug_container("debugger-3", securityContext={"privileged": True}))
    response = await webhook.admit("/validate", refused)
    assert response["status"]["message"].startswith("spec.ephemeralContainers[1].securityContext")


async def test_debug_containers_of_other_pods_are_not_ours(webhook: Webhook) -> None:
    old = plain_pod()
    privileged = debug_container(securityContext={"privileged": True})
    assert (await webhook.admit("/validate", debugged(old, privileged)))["allowed"] is True
