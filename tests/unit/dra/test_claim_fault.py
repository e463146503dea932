"""What a kubelet's claim reference may be (``claim_fault``): the namespace a DNS-1123
label, the name a DNS-1123 subdomain, the UID of letters, digits and ``._-`` (it becomes
part of file names and request ids); a refusal names the field and never writes the value
raw."""

from __future__ import annotations

import pytest

from agent.dra.port import ClaimRef, claim_fault

UID = "7d1c4c1e-0b8a-4c1e-9a51-3f0f5b3c9e11"


@pytest.mark.parametrize(
    "ref",
    [
        ClaimRef("team-a", "app-gpu-x7k2p", UID),
        ClaimRef("n" * 63, "c" * 253, "u" * 128),
        ClaimRef("ns", "claim.with.dots", "U-1_a.b"),  # not a UUID: kept, as it always was
    ],
)
def test_a_kubernetes_reference_is_kept(ref: ClaimRef) -> None:
    assert claim_fault(ref) == ""


@pytest.mark.parametrize(
    ("ref", "field", "why"),
    [
        (ClaimRef("", "c", UID), "namespace", "is empty"),
        (ClaimRef("n" * 64, "c", UID), "namespace", "is longer than 63 characters"),
        (ClaimRef("Team", "c", UID), "namespace", "holds U+0054"),
        (ClaimRef("a.b", "c", UID), "namespace", "holds U+002E (FULL STOP)"),
        (ClaimRef("ns", "c" * 254, UID), "name", "is longer than 253 characters"),
        (ClaimRef("ns", "-c", UID), "name", "is not a DNS-1123 subdomain"),
        (ClaimRef("ns", "c\nforged", UID), "name", "holds U+000A (control character)"),
        (ClaimRef("ns", "c", "../../x"), "uid", "holds U+002F (SOLIDUS) at position 2"),
        (ClaimRef("ns", "c", ".u"), "uid", "is not a UID"),
        (ClaimRef("ns", "c", "a/b"), "uid", "holds U+002F (SOLIDUS)"),
        (ClaimRef("ns", "c", "a:b"), "uid", "holds U+003A (COLON)"),
        (ClaimRef("ns", "c", "u\x00"), "uid", "holds U+0000"),
        (ClaimRef("ns", "c", "u" * 129), "uid", "is longer than 128 characters"),
    ],
)
def test_a_bad_reference_names_its_field_and_why(ref: ClaimRef, field: str, why: str) -> None:
    fault = claim_fault(ref)
    assert fault.startswith(f"invalid claim: its {field} "), fault
    assert why in fault and fault.isprintable() and len(fault) < 300
