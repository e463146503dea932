"""What a Kubernetes object's namespace, name and UID may be: the one place these rules
live, for every part that reads such values from outside (the DRA kubelet plugin's claim
references, the agent's API, the scheduler extender's arguments).

The rules are apimachinery's (``k8s.io/apimachinery/pkg/util/validation``):

- :data:`LABEL`, ``IsDNS1123Label``: at most 63 characters, lowercase letters, digits
  and ``-``, a letter or digit first and last. Namespaces are labels.
- :data:`SUBDOMAIN`, ``IsDNS1123Subdomain``: at most 253 characters, labels joined by
  ``.`` (each label unbounded but by the whole). Pods, nodes and ResourceClaims are named
  so.
- :data:`UID`: the API server gives every object an RFC 4122 UUID
  (``7d1c4c1e-0b8a-4c1e-9a51-3f0f5b3c9e11``), but it never validates one it is given,
  and test clusters, simulators and other servers write other forms. The rule is lenient
  where the callers always were: at most 128 characters, letters (either case), digits
  and ``._-``, a letter or digit first. It is strict where they need it: a UID becomes a
  file name (no ``/``, never ``.`` or ``..``), and part of request ids that ``:`` and
  ``/`` divide (:mod:`agent.core.lease`). :data:`UUID_PATTERN` is the strict form, for
  what only the API server's UUIDs may match (a pod UID found in a cgroup path).

A rule's :meth:`NameRule.fault` says why a value breaks it without repeating the value
(the caller shows it, escaped and cut): every character outside the rule's alphabet
(controls, separators, bidirectional marks, any non-ASCII letter) is named by its code
point. Values are matched whole (``fullmatch``: a trailing newline is not forgiven as
``$`` forgives it), and their length is checked before any pattern runs.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

LABEL_MAX_CHARS = 63
SUBDOMAIN_MAX_CHARS = 253
UID_MAX_CHARS = 128
UUID_PATTERN = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


@dataclass(frozen=True, slots=True)
class NameRule:
    """One kind of Kubernetes value: what it is called, its longest, its whole shape and
    its alphabet (the characters it may hold at all, for a precise refusal)."""

    what: str
    max_chars: int
    pattern: re.Pattern[str]
    alphabet: re.Pattern[str]  # one character outside it
    spelled: str  # the shape in words, for a refusal

    def holds(self, value: str) -> bool:
        """Whether ``value`` keeps the rule."""
        return 0 < len(value) <= self.max_chars and self.pattern.fullmatch(value) is not None

    def fault(self, value: str) -> str:
        """Why ``value`` breaks the rule, as a predicate ("is empty", "holds U+000A ...");
        "" when it keeps it. Never repeats ``value``."""
        if not value:
            return "is empty"
        if len(value) > self.max_chars:
            return f"is longer than {self.max_chars} characters ({len(value)})"
        if self.pattern.fullmatch(value):
            return ""
        stray = self.alphabet.search(value)
        if stray is not None:
            return f"holds {code_point(stray.group())} at position {stray.start()}"
        return f"is not {self.what}: {self.spelled}"


def code_point(ch: str) -> str:
    """``U+202E (RIGHT-TO-LEFT OVERRIDE)``, ``U+000A (control character)``: a character
    named without being written (controls have no Unicode name)."""
    control = unicodedata.category(ch) == "Cc"
    name = unicodedata.name(ch, "control character" if control else "unnamed")
    return f"U+{ord(ch):04X} ({name})"


LABEL = NameRule(
    "a DNS-1123 label",
    LABEL_MAX_CHARS,
    re.compile(_LABEL),
    re.compile(r"[^-a-z0-9]"),
    "lowercase letters, digits and '-', a letter or digit first and last",
)
SUBDOMAIN = NameRule(
    "a DNS-1123 subdomain",
    SUBDOMAIN_MAX_CHARS,
    re.compile(rf"{_LABEL}(\.{_LABEL})*"),
    re.compile(r"[^-.a-z0-9]"),
    "DNS-1123 labels joined by '.'",
)
UID = NameRule(
    "a UID",
    UID_MAX_CHARS,
    re.compile(r"[A-Za-z0-9][-._A-Za-z0-9]*"),
    re.compile(r"[^-._A-Za-z0-9]"),
    "letters, digits and '._-', a letter or digit first",
)
NAMESPACE = LABEL  # IsDNS1123Label, as ValidateNamespaceName
OBJECT_NAME = SUBDOMAIN  # pods, nodes, ResourceClaims: NameIsDNSSubdomain
