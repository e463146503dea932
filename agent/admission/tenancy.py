"""Who may share a device's MPS server: one trust domain, and one user, at a time. Pure.

- **One trust domain.** A fatal fault in one client of an MPS server reaches every client
  of that server, so a shared device holds leases of one trust domain at a time
  (``TRUST_CONFLICT``).
- **One user.** The MPS control daemon runs one server per UID at a time: a client of
  another UID waits in CUDA initialisation until every client of the running server's UID
  has ended. Two shares of one device whose processes run as different users would not run
  side by side, so a request that states its UID (``run_as_uid``) is refused on a device
  whose live leases include one of another known UID (``USER_CONFLICT``). Leases without a
  UID (made before UIDs were recorded, or by callers that do not say) do not count, and a
  request without one is not checked: the agent cannot know whose it is (its clients may
  then wait in CUDA initialisation if their UID differs). The rule holds on MPS devices
  only (an exclusive device holds one lease anyway), and not where the daemons run in
  multi-user mode (``mps.multi_user``), which serves several UIDs at once.

Both rules count every lease that holds capacity, reserved gang members and a batch's
earlier placements included. Preemption treats them alike: evicting a device's
best-effort leases of another domain or UID makes room only when none of that domain or
UID is left on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from agent.core.lease import Lease
from agent.core.types import AdmissionRequest, Device, ReasonCode, SharingMode

Refusal = tuple[ReasonCode, str]


def domains_of(leases: Iterable[Lease], kept: frozenset[str] | None) -> Set[str]:
    """The trust domains on a device: the ledger's count when it keeps one, else summed."""
    return kept if kept is not None else {x.trust_domain for x in leases}


def users_of(leases: Iterable[Lease], kept: frozenset[int] | None) -> Set[int]:
    """The known UIDs on a device (leases without one do not count): the ledger's count
    when it keeps one, else summed."""
    if kept is not None:
        return kept
    return {x.run_as_uid for x in leases if x.run_as_uid is not None}


def trust_refusal(domains: Set[str], request: AdmissionRequest) -> Refusal | None:
    """TRUST_CONFLICT when the device serves another trust domain."""
    if not domains or domains == {request.trust_domain}:
        return None
    other = sorted(domains)[0]
    return ReasonCode.TRUST_CONFLICT, (
        f"device serves trust domain {other!r}; an MPS server shares fault fate, so "
        f"{request.trust_domain!r} may not join it"
    )


def user_refusal(
    users: Set[int], request: AdmissionRequest, device: Device, *, one_user_per_device: bool
) -> Refusal | None:
    """USER_CONFLICT when the device's MPS server runs as another known UID."""
    uid = request.run_as_uid
    if not one_user_per_device or device.sharing_mode is not SharingMode.MPS or uid is None:
        return None
    others = sorted(users - {uid})
    if not others:
        return None
    running = others[0]
    return ReasonCode.USER_CONFLICT, (
        f"device's MPS server runs as UID {running}; a client of UID {uid} would wait in "
        f"CUDA initialisation until every client of UID {running} ends "
        "(one user per MPS control daemon)"
    )
