"""What the DRA kubelet plugin asks of the agent: prepare and unprepare claims (one
answer per claim, never one error for all), and the health of the devices it publishes.
The kubelet sends only each claim's namespace, name and UID; the driver reads the rest
(its allocation) from the API itself."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

DRIVER_NAME = "gpushare.io"


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


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
