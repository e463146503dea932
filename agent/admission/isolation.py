"""What a device's sharing mode isolates between the leases on it, stated in three words.

Pure: a device in, an :class:`Isolation` out. The API puts it on every device and on every
admitted answer, so a scheduler and a tenant read what they get instead of inferring it.

- ``exclusive`` (a whole GPU or a MIG instance): one lease holds the device. Its memory is
  its own (``hardware``), a fatal fault ends only that lease (``contained``), and its SMs
  are its own (``partition``: the whole GPU, or the instance's dedicated slice).
- ``mps``: every lease is a client of the device's one MPS server. Memory is a pinned
  device-memory limit per client process, enforced by MPS, not a partition (``limit``); a
  fatal fault in one client is delivered to every client of that server, which is why a
  shared device holds leases of one trust domain (``shared-with-trust-domain``); the
  active thread percentage caps a client's share of the SMs, while memory bandwidth and L2
  stay shared (``share``).

A MIG instance shared through MPS is an MPS device: the MIG partition walls it off from the
other instances of its GPU, but the leases inside it share one MPS server, so between them
the MPS words apply. The MIG boundary itself is stated by the device's ``parent_uuid`` and
``mig_profile``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.core.types import Device, SharingMode


class MemoryIsolation(enum.StrEnum):
    HARDWARE = "hardware"  # the lease has the device's (or MIG instance's) memory to itself
    LIMIT = "limit"  # an MPS pinned-memory limit per client process; no hardware partition


class FaultIsolation(enum.StrEnum):
    CONTAINED = "contained"  # a fatal fault ends only the lease that caused it
    SHARED_WITH_TRUST_DOMAIN = "shared-with-trust-domain"  # ends every client of the server


class ComputeIsolation(enum.StrEnum):
    PARTITION = "partition"  # dedicated SMs: the whole GPU, or the MIG instance's slice
    SHARE = "share"  # an MPS active-thread share of the SMs; memory bandwidth stays shared


@dataclass(frozen=True, slots=True)
class Isolation:
    memory: MemoryIsolation
    faults: FaultIsolation
    compute: ComputeIsolation

    @property
    def phrase(self) -> str:
        return isolation_phrase(self.memory, self.faults, self.compute)


EXCLUSIVE = Isolation(
    MemoryIsolation.HARDWARE, FaultIsolation.CONTAINED, ComputeIsolation.PARTITION
)
MPS_SHARED = Isolation(
    MemoryIsolation.LIMIT, FaultIsolation.SHARED_WITH_TRUST_DOMAIN, ComputeIsolation.SHARE
)

_PHRASES: dict[tuple[str, str], str] = {
    ("memory", MemoryIsolation.HARDWARE): "its own",
    ("memory", MemoryIsolation.LIMIT): "a per-client limit",
    ("faults", FaultIsolation.CONTAINED): "contained",
    ("faults", FaultIsolation.SHARED_WITH_TRUST_DOMAIN): "shared by its leases",
    ("compute", ComputeIsolation.PARTITION): "dedicated SMs",
    ("compute", ComputeIsolation.SHARE): "an SM share",
}


def isolation_of(device: Device) -> Isolation:
    """What the device's sharing mode isolates between the leases on it."""
    if device.sharing_mode is SharingMode.EXCLUSIVE:
        return EXCLUSIVE
    return MPS_SHARED


def isolation_phrase(memory: str, faults: str, compute: str) -> str:
    """One line for people, from the three words; a word this version does not know (from
    a newer agent) is shown as it came."""
    words = (("memory", memory), ("faults", faults), ("compute", compute))
    return "; ".join(f"{name}: {_PHRASES.get((name, word), word or '?')}" for name, word in words)
