"""What the DRA kubelet plugin asks of the agent: prepare and unprepare claims (one
answer per claim, never one error for all), and the health of the devices it publishes.
The kubelet sends only each claim's namespace, name and UID; the driver reads the rest
(its allocation) from the API itself. A reference that is not a Kubernetes object's
(:func:`claim_fault`) never reaches the driver: the UID becomes part of file names and
request ids, and all three are written into log lines."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.api.validate import forbidden_character, shown

DRIVER_NAME = "gpushare.io"
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


@dataclass(frozen=True, slots=True)
class _Rule:
    most: int
    pattern: re.Pattern[str]
    what: str


NAMESPACE_RULE = _Rule(63, re.compile(_LABEL), "a DNS label: lowercase letters, digits and '-'")
NAME_RULE = _Rule(
    253, re.compile(rf"{_LABEL}(\.{_LABEL})*"), "a DNS subdomain: labels joined by '.'"
)
UID_RULE = _Rule(128, re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*"), "letters, digits and '._-'")


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        """Escaped and cut (whatever the kubelet sent): fit for a log line."""
        return f"{shown(f'{self.namespace}/{self.name}')} (uid {shown(self.uid)})"


def claim_fault(ref: ClaimRef) -> str:
    """Why ``ref`` cannot name a ResourceClaim ("" when it can): the namespace must be a
    DNS label, the name a DNS subdomain, the UID of letters, digits and ``._-``."""
    for field, value, rule in (
        ("namespace", ref.namespace, NAMESPACE_RULE),
        ("name", ref.name, NAME_RULE),
        ("uid", ref.uid, UID_RULE),
    ):
        fault = _fault(value, rule)
        if fault:
            return f"invalid claim: its {field} {shown(value)} {fault}"
    return ""


def _fault(value: str, rule: _Rule) -> str:
    if not value:
        return "is empty"
    if len(value) > rule.most:
        return f"is longer than {rule.most} characters ({len(value)})"
    found = forbidden_character(value)
    if found is not None:
        return f"holds a control, separator or bidirectional character: {found}"
    if not rule.pattern.fullmatch(value):
        return f"is not {rule.what}"
    return ""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocated device of a claim, ready for the containers that reference it."""

    request_names: tuple[str, ...]  # base request names ("req/sub" is "req")
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A claim's answer: its devices, or why it cannot be prepared (``error``)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class Health(enum.IntEnum):
    """The values of the kubelet's ``HealthStatus``."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    pool_name: str
    device_name: str
    health: Health
    message: str = ""  # at most 1024 characters reach the kubelet


class Driver(Protocol):
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Prepared]:
        """One answer per claim UID; may be called again for claims already prepared (the
        same answer then)."""
        ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """One error text per claim UID ("" when done); a claim never prepared is done."""
        ...

    def health(self) -> Sequence[DeviceHealth]:
        """Every published device's health, now."""
        ...
