"""The Kubernetes name and UID rules (apimachinery's IsDNS1123Label and IsDNS1123Subdomain;
a UID as lenient as the agent's readers need it and no more): each value against each rule,
at the edges, and a refusal that names what is wrong without writing it."""

from __future__ import annotations

import re

import pytest

from agent.core import k8snames
from agent.core.k8snames import LABEL, SUBDOMAIN, UID, NameRule

REAL_UID = "7d1c4c1e-0b8a-4c1e-9a51-3f0f5b3c9e11"
LABEL_63 = "a" * 63
SUBDOMAIN_253 = ".".join(["a" * 63] * 3 + ["b" * 61])  # 63*3 + 61 + 3 dots = 253

# (what, value, is a label, is a subdomain, is a UID)
CASES = [
    ("empty", "", False, False, False),
    ("one letter", "a", True, True, True),
    ("one digit", "0", True, True, True),
    ("63 characters", LABEL_63, True, True, True),
    ("64 characters", "a" * 64, False, True, True),
    ("128 characters", "a" * 128, False, True, True),
    ("129 characters", "a" * 129, False, True, False),
    ("253 characters of labels", SUBDOMAIN_253, False, True, False),
    ("254 characters", SUBDOMAIN_253 + "c", False, False, False),
    ("a real UID", REAL_UID, True, True, True),
    ("uppercase", "Web", False, False, True),
    ("leading '-'", "-web", False, False, False),
    ("trailing '-'", "web-", False, False, True),
    ("inner '-'", "web-7d4b9c", True, True, True),
    ("a dot inside", "pod.with.dots", False, True, True),
    ("leading '.'", ".web", False, False, False),
    ("trailing '.'", "web.", False, False, True),
    ("two dots", "a..b", False, False, True),
    ("'.' alone", ".", False, False, False),
    ("'..' alone", "..", False, False, False),
    ("a label ending in '-' inside", "a-.b", False, False, True),
    ("underscore", "a_b", False, False, True),
    ("unicode letter", "café", False, False, False),
    ("unicode digit", "a\u0663", False, False, False),
    ("NUL", "a\x00b", False, False, False),
    ("newline inside", "a\nb", False, False, False),
    ("trailing newline", "web\n", False, False, False),
    ("bidi override", "a\u202eb", False, False, False),
    ("'/' (a path in a UID)", "../../etc", False, False, False),
    ("'/' inside", "a/b", False, False, False),
    ("':' (divides request ids)", "a:b", False, False, False),
    ("space", "a b", False, False, False),
]


@pytest.mark.parametrize(
    ("value", "label", "subdomain", "uid"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_value_against_each_rule(value: str, label: bool, subdomain: bool, uid: bool) -> None:
    for rule, expected in ((LABEL, label), (SUBDOMAIN, subdomain), (UID, uid)):
        assert rule.holds(value) is expected, rule.what
        assert (rule.fault(value) == "") is expected, rule.what


def test_the_subdomain_edge_is_made_as_meant() -> None:
    assert len(SUBDOMAIN_253) == 253


def test_namespaces_are_labels_and_objects_subdomains() -> None:
    assert k8snames.NAMESPACE is LABEL and k8snames.OBJECT_NAME is SUBDOMAIN


@pytest.mark.parametrize(
    ("rule", "value", "fault"),
    [
        (LABEL, "", "is empty"),
        (LABEL, "a" * 64, "is longer than 63 characters (64)"),
        (SUBDOMAIN, "a" * 1_000_000, "is longer than 253 characters (1000000)"),
        (UID, "u" * 129, "is longer than 128 characters (129)"),
        (LABEL, "ab\ncd", "holds U+000A (control character) at position 2"),
        (SUBDOMAIN, "a\x00", "holds U+0000 (control character) at position 1"),
        (UID, "ok\u202e", "holds U+202E (RIGHT-TO-LEFT OVERRIDE) at position 2"),
        (UID, "a/b", "holds U+002F (SOLIDUS) at position 1"),
        (SUBDOMAIN, "Web", "holds U+0057 (LATIN CAPITAL LETTER W) at position 0"),
        (LABEL, "a.b", "holds U+002E (FULL STOP) at position 1"),
        (LABEL, "-a", "is not a DNS-1123 label: "),
        (SUBDOMAIN, "a..b", "is not a DNS-1123 subdomain: "),
        (UID, "-u", "is not a UID: "),
    ],
)
def test_a_fault_says_why_and_never_writes_the_value(
    rule: NameRule, value: str, fault: str
) -> None:
    said = rule.fault(value)
    assert said.startswith(fault), said
    assert said.isprintable() and len(said) < 120


def test_the_uuid_pattern_is_the_api_servers_form() -> None:
    pattern = re.compile(k8snames.UUID_PATTERN)
    assert pattern.fullmatch(REAL_UID)
    for other in (REAL_UID.upper(), REAL_UID[:-1], REAL_UID.replace("-", ""), "u-1"):
        assert not pattern.fullmatch(other), other


@pytest.mark.parametrize(
    ("ch", "named"),
    [
        ("\x00", "U+0000 (control character)"),
        ("\x85", "U+0085 (control character)"),
        ("\u2028", "U+2028 (LINE SEPARATOR)"),
        ("é", "U+00E9 (LATIN SMALL LETTER E WITH ACUTE)"),
        ("\U000e0001", "U+E0001 (LANGUAGE TAG)"),
        ("\u0378", "U+0378 (unnamed)"),
    ],
)
def test_a_character_is_named_by_its_code_point(ch: str, named: str) -> None:
    assert k8snames.code_point(ch) == named
