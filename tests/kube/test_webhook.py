"""The admission webhook over real HTTP on loopback (and HTTPS with real certificates),
with AdmissionReview bodies as the API server sends them: what it mutates, which reviews
are of a pod, what reaches its log, malformed reviews, and serving over TLS. Its
refusals, the share's user and updates are in test_webhook_*.py beside it."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.core.errors import ConfigError
from agent.legacy.cluster.annotations import FINALIZER, SCHEDULER_NAME
from agent.legacy.cluster.webhook import MAX_REVIEW_BYTES, serve_webhook
from tests.certs import make_pki
from tests.kube.webhook_reviews import (
    Pod,
    Webhook,
    annotate,
    apply_patch,
    changed,
    container,
    gpu_pod,
    patch_of,
    plain_pod,
    review,
    security,
)

# -- mutation ----------------------------------------------------------------------------


async def test_a_valid_pod_gets_the_scheduler_and_the_finalizer(webhook: Webhook) -> None:
    pod = gpu_pod()
    mutated = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    assert mutated["spec"]["schedulerName"] == SCHEDULER_NAME
    assert mutated["metadata"]["finalizers"] == [FINALIZER]
    mutated["spec"]["schedulerName"] = pod["spec"]["schedulerName"]
    del mutated["metadata"]["finalizers"]
    assert mutated == pod  # nothing else changed


async def test_a_pod_without_a_scheduler_name_gets_ours(webhook: Webhook) -> None:
    pod = gpu_pod()
    del pod["spec"]["schedulerName"]
    mutated = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    assert mutated["spec"]["schedulerName"] == SCHEDULER_NAME


async def test_an_existing_finalizer_list_is_appended_to(webhook: Webhook) -> None:
    pod = gpu_pod()
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    mutated = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    assert mutated["metadata"]["finalizers"] == ["example.com/keep", FINALIZER]


async def test_a_second_mutation_adds_nothing(webhook: Webhook) -> None:
    pod = gpu_pod()
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    once = apply_patch(pod, patch_of(await webhook.admit("/mutate", review(pod))))
    again = await webhook.admit("/mutate", review(once))
    assert again["allowed"] is True
    assert "patch" not in again and "patchType" not in again
    assert once["metadata"]["finalizers"].count(FINALIZER) == 1


async def test_a_pod_in_the_requests_namespace_only_is_read_with_it(webhook: Webhook) -> None:
    pod = gpu_pod(**{"gpushare.io/gang": "g" * 121, "gpushare.io/gang-size": "2"})
    del pod["metadata"]["namespace"]  # the request's namespace, team-a, is the pod's
    assert (await webhook.admit("/mutate", review(pod)))["allowed"] is True
    pod["metadata"]["annotations"]["gpushare.io/gang"] = "g" * 122  # team-a/ + 122 > 128
    refused = await webhook.admit("/mutate", review(pod))
    assert refused["status"]["message"].startswith("gpushare.io/gang: is too long")


async def test_validate_allows_a_valid_pod_without_a_patch(webhook: Webhook) -> None:
    response = await webhook.admit("/validate", review(gpu_pod()))
    assert response["allowed"] is True
    assert "patch" not in response


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    "make",
    [
        plain_pod,
        lambda: {**plain_pod(), "spec": {**plain_pod()["spec"], "schedulerName": "other"}},
        lambda: {
            **plain_pod(),
            "spec": {
                **plain_pod()["spec"],
                "containers": [
                    container(
                        share=False,
                        securityContext={"privileged": True},
                        env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/x"}],
                        envFrom=[{"configMapRef": {"name": "gpu-all"}}],
                        resources={"limits": {"nvidia.com/gpu": "1"}},
                    )
                ],
                "volumes": [{"name": "h", "hostPath": {"path": "/run/gpushare"}}],
            },
        },
    ],
    ids=["plain", "other scheduler", "privileged whole-GPU pod"],
)
async def test_pods_without_a_share_are_untouched(
    webhook: Webhook, path: str, make: Callable[[], Pod]
) -> None:
    response = await webhook.admit(path, review(make()))
    assert response == {"uid": response["uid"], "allowed": True}


# -- which reviews are of a pod ----------------------------------------------------------


async def test_a_pod_is_checked_whatever_the_kind_says(webhook: Webhook) -> None:
    """The API server sends request.kind and request.resource; a review that says pods in
    either (or carries a Pod) is judged as a pod's."""
    pod = changed(security({"privileged": True}))
    for kind in ({"group": "apps", "version": "v1", "kind": "Deployment"}, {"kind": 7}):
        body = review(pod)
        body["request"]["kind"] = kind
        for path in ("/validate", "/mutate"):
            response = await webhook.admit(path, body)
            assert response["allowed"] is False, (kind, response)
            assert response["status"]["code"] == 403
    body = review(pod)
    body["request"]["kind"] = {"group": "", "version": "v1", "kind": "Node"}
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "nodes"}
    body["request"]["object"] = {**pod, "kind": "Pod"}
    assert (await webhook.admit("/validate", body))["allowed"] is False


async def test_a_review_of_something_else_is_allowed(webhook: Webhook) -> None:
    body = review({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "c"}})
    body["request"]["kind"] = {"group": "", "version": "v1", "kind": "ConfigMap"}
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "configmaps"}
    assert (await webhook.admit("/validate", body))["allowed"] is True


# -- what reaches the log ----------------------------------------------------------------


async def test_a_refusal_is_one_escaped_log_line(
    webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    pod = changed(security({"privileged": True}))
    pod["metadata"]["name"] = (
        "train\nINFO agent.legacy.cluster.webhook: allowed CREATE of pod team-a/x"
    )
    pod["metadata"]["namespace"] = "team-a\r\x1b[2K"
    with caplog.at_level("INFO", logger="agent.legacy.cluster.webhook"):
        response = await webhook.admit("/validate", review(pod))
    assert response["allowed"] is False
    [record] = [r for r in caplog.records if r.name == "agent.legacy.cluster.webhook"]
    line = record.getMessage()
    assert line.isprintable(), line
    assert "train\\nINFO" in line  # escaped, still readable
    assert record.exc_info is None


async def test_long_values_are_not_echoed(webhook: Webhook) -> None:
    pod = changed(annotate(**{"gpushare.io/memory": "1e999"}))
    response = await webhook.admit("/validate", review(pod))
    message = response["status"]["message"]
    assert message.startswith("gpushare.io/memory: ")
    assert len(message) < 200 and "0" * 41 not in message, message


# -- malformed reviews, health -----------------------------------------------------------


def without(key: str) -> dict[str, Any]:
    body = review(gpu_pod())
    del body["request"][key]
    return body


MALFORMED: list[tuple[str, Any, str]] = [
    ("not JSON", b"{not json", "not an AdmissionReview"),
    ("a list", [], "must be a JSON object"),
    ("old API", {**review(gpu_pod()), "apiVersion": "admission.k8s.io/v1beta1"},
     "expected apiVersion admission.k8s.io/v1"),
    ("another kind", {**review(gpu_pod()), "kind": "Pod"}, "kind AdmissionReview"),
    ("no request", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
     "request is missing"),
    ("no uid", without("uid"), "request.uid is missing"),
    ("no operation", without("operation"), "request.operation"),
    ("create without object", review(None), "request.object must be an object for CREATE"),
    ("update without old", review(gpu_pod(), operation="UPDATE"), "request.oldObject"),
    ("a string", "AdmissionReview", "must be a JSON object"),
    ("a number", 1e308, "must be a JSON object"),
    ("nested 50,000 deep", b"[" * 50_000 + b"]" * 50_000, "nested deeper than 64"),
    ("objects nested 50,000 deep", b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
     "nested deeper than 64"),
    ("nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000, "more than 100000 values"),
    ("a pod nested deep", json.dumps(review(gpu_pod())).replace(
        '"status": {}', '"status": ' + "[" * 70 + "]" * 70).encode(), "nested deeper than 64"),
    ("open brackets only", b"[" * 90_000, "nested deeper than 64"),
    ("a million open brackets", b"[" * 1_000_000, "has more than 100000 values"),
    ("half a review", json.dumps(review(gpu_pod())).encode()[:-10], "not JSON"),
    ("not UTF-8", b'{"kind": "\xff"}', "not UTF-8"),
    ("UTF-16", json.dumps(review(gpu_pod())).encode("utf-16"), "not UTF-8"),
    ("too many values", b"[" + b"0," * 300_000 + b"0]", "more than"),
    ("a huge integer", b"[" + b"9" * 5000 + b"]", "has a number of more than 100 digits"),
    ("an integer of 4,300 digits in a pod", json.dumps(review(gpu_pod())).replace(
        '"status": {}', '"status": ' + "9" * 4300).encode(), "more than 100 digits"),
    ("no kind", without("kind"), "request.kind is missing"),
    ("a kind without kind", {**review(gpu_pod()), "request": {
        **review(gpu_pod())["request"], "kind": {"group": "", "version": "v1"}}},
     "request.kind is missing"),
    ("a uid of a megabyte", {**review(gpu_pod()), "request": {
        **review(gpu_pod())["request"], "uid": "u" * 2**20}}, "request.uid"),
    ("a sub-resource that is not a string", {**review(gpu_pod()), "request": {
        **review(gpu_pod())["request"], "subResource": {"name": "status"}}},
     "request.subResource"),
]  # fmt: skip


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("body", "reason"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
async def test_malformed_reviews_are_400(
    webhook: Webhook, path: str, body: Any, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("DEBUG"):
        status, text = await webhook.post(path, body)
    assert status == 400
    assert reason in text, text
    assert len(text) < 1000, text  # says what is wrong, never repeats the body
    assert not [r for r in caplog.records if r.exc_info], "an expected error is no traceback"
    assert all(r.getMessage().isprintable() for r in caplog.records)


async def test_a_body_over_the_limit_is_413(webhook: Webhook) -> None:
    status, _ = await webhook.post("/validate", b" " * (MAX_REVIEW_BYTES + 1))
    assert status == 413


async def test_health_and_methods(webhook: Webhook) -> None:
    async with webhook.session.get(webhook.url + "/healthz") as answer:
        assert answer.status == 200
        assert await answer.text() == "ok"
    async with webhook.session.get(webhook.url + "/mutate") as answer:
        assert answer.status == 405


# -- HTTPS -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_serve_webhook_over_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    port = free_port()
    serving = asyncio.create_task(
        serve_webhook("127.0.0.1", port, str(pki.server_cert), str(pki.server_key)),
        name="webhook",
    )
    trust = ssl.create_default_context(cafile=str(pki.ca))
    url = f"https://localhost:{port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust)) as session:
            for _ in range(100):
                try:
                    async with session.get(url + "/healthz") as answer:
                        assert await answer.text() == "ok"
                        break
                except aiohttp.ClientConnectorError:
                    assert not serving.done(), serving
                    await asyncio.sleep(0.05)
            client = Webhook(session, url)
            pod = gpu_pod()
            mutated = apply_patch(pod, patch_of(await client.admit("/mutate", review(pod))))
            assert mutated["spec"]["schedulerName"] == SCHEDULER_NAME
        async with aiohttp.ClientSession() as plain:  # no trust in the test CA: refused
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await plain.get(url + "/healthz")
    finally:
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving


async def test_serve_webhook_without_its_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load"):
        await serve_webhook("127.0.0.1", 0, str(tmp_path / "no.crt"), str(tmp_path / "no.key"))
