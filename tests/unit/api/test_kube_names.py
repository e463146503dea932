"""Kubernetes names the API reads (``request.pod``, a claim's metadata in ``claim_json``):
upstream's rules (:mod:`agent.core.k8snames`), matched whole, the part at fault named."""

from __future__ import annotations

import json

import pytest

from agent.api import validate
from agent.core.errors import ValidationError

UID = "7d1c4c1e-0b8a-4c1e-9a51-3f0f5b3c9e11"


def claim(**meta: object) -> bytes:
    return json.dumps({"metadata": {"uid": UID, "namespace": "team-a", "name": "c", **meta}})


@pytest.mark.parametrize(
    ("meta", "field", "why"),
    [
        ({"namespace": "team-a\n"}, "metadata.namespace", "U+000A"),  # `$` forgave this once
        ({"name": "c\n"}, "metadata.name", "U+000A"),
        ({"namespace": "n" * 64}, "metadata.namespace", "longer than 63"),
        ({"name": "c" * 254}, "metadata.name", "longer than 253"),
        ({"name": "-c"}, "metadata.name", "not a DNS-1123 subdomain"),
        ({"uid": "a/b"}, "metadata.uid", "U+002F (SOLIDUS)"),  # once a valid identifier
        ({"uid": "dra:x"}, "metadata.uid", "U+003A (COLON)"),
        ({"uid": "-u"}, "metadata.uid", "not a UID"),
        ({"uid": "u" * 129}, "metadata.uid", "longer than 128"),
    ],
)
def test_a_claim_not_named_as_kubernetes_names_is_refused(
    meta: dict[str, object], field: str, why: str
) -> None:
    with pytest.raises(ValidationError) as info:
        validate.claim_json(claim(**meta).encode())
    assert info.value.field == f"claim_json.{field}"
    assert why in str(info.value) and str(info.value).isprintable()


@pytest.mark.parametrize("uid", [UID, "u-1", "UPPER.case_1"])
def test_a_claim_named_by_kubernetes_is_read(uid: str) -> None:
    assert validate.claim_json(claim(uid=uid).encode())["metadata"]["uid"] == uid


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("Team/pod", "its namespace holds U+0054"),
        ("ns/", "its name is empty"),
        ("/pod", "its namespace is empty"),
        ("ns/pod/extra", "its name holds U+002F"),
        ("ns/pod\n", "its name holds U+000A"),
    ],
)
def test_a_pod_refusal_names_the_part_at_fault(value: str, why: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate.pod(value, "request.pod")
    assert info.value.field == "request.pod"
    assert "<namespace>/<pod name>" in str(info.value) and why in str(info.value)
