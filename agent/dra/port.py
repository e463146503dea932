"""What the DRA kubelet plugin asks of the agent: prepare and unprepare claims (one
answer per claim, never one error for all), and the health of the devices it publishes.
The kubelet sends only each claim's namespace, name and UID; the driver reads the rest
(its allocation) from the API itself. A reference that is not a Kubernetes object's
(:func:`claim_fault`) never reaches the driver: the UID becomes part of file names and
request ids, and all three are written into log lines."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.api.validate import shown
from agent.core import k8snames

DRIVER_NAME = "gpushare.io"


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
    DNS-1123 label, the name a DNS-1123 subdomain, the UID of letters, digits and ``._-``
    (:mod:`agent.core.k8snames`: no ``/`` or ``:``, as it is part of file names and request
    ids)."""
    for field, value, rule in (
        ("namespace", ref.namespace, k8snames.NAMESPACE),
        ("name", ref.name, k8snames.OBJECT_NAME),
        ("uid", ref.uid, k8snames.UID),
    ):
        fault = rule.fault(value)
        if fault:
            return f"invalid claim: its {field} {shown(value)} {fault}"
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
