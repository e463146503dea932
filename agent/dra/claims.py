"""Reading a ResourceClaim as the driver needs it: the shares the scheduler allocated to
this driver on this node (device, share id, consumed capacity), the claim's opaque
configuration for this driver, the pods it is reserved for, and the conditions the driver
writes back into its ``status.devices``. Pure functions of the claim's JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.api.validate import MAX_MEMORY_BYTES, MIN_MEMORY_BYTES, identifier, shown
from agent.core.errors import UnitError, ValidationError
from agent.core.quantity import quantity, quantity_bytes

Obj = dict[str, Any]
ADMITTED = "gpushare.io/admitted"  # the binding condition the driver sets
REFUSED = "gpushare.io/refused"  # and its failure condition
CONFIG_KIND = "ShareConfig"
CONFIG_API = "gpushare.io/v1"
PRIORITIES = ("guaranteed", "burstable", "best-effort")


class ClaimError(Exception):
    """The claim cannot be prepared as it is (the text reaches the pod's events)."""


@dataclass(frozen=True, slots=True)
class Share:
    """One allocated device of a claim, for this driver on this node."""

    request: str  # the base request name ("gpu" of "gpu/small")
    device: str
    share_id: str  # "" for a result without one (a dedicated allocation)
    memory_bytes: int | None  # consumed; None when the result names none
    thread_pct: float | None
    binding_conditions: tuple[str, ...] = ()
    admin: bool = False  # adminAccess: the device without a share (no lease, no limits)

    @property
    def key(self) -> str:
        """What tells this share from the claim's others (a request may hold several
        devices, a device several requests)."""
        return self.share_id or f"{self.request}-{self.device}"


@dataclass(frozen=True, slots=True)
class ShareConfig:
    priority: str = "burstable"
    profile: str | None = None
    retention_floor: float | None = None


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def allocation(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return (claim.get("status") or {}).get("allocation") or None


def results_here(claim: Mapping[str, Any], driver: str, pool: str) -> list[Share]:
    """Every result of ``driver`` in ``pool`` (shares and ``adminAccess`` devices), each
    checked; [] when none (or not allocated). Other drivers' results are not read."""
    found = allocation(claim)
    if found is None:
        return []
    results = ((found.get("devices") or {}).get("results")) or []
    return [_share(r) for r in results if r.get("driver") == driver and r.get("pool") == pool]


def shares(claim: Mapping[str, Any], driver: str, pool: str) -> list[Share]:
    """The claim's shares of ``driver`` in ``pool`` (``adminAccess`` results are not)."""
    return [s for s in results_here(claim, driver, pool) if not s.admin]


def _share(result: Mapping[str, Any]) -> Share:
    device = _name(result.get("device"), "device")
    request = _name(result.get("request"), "request").partition("/")[0]
    consumed = result.get("consumedCapacity") or {}
    if not isinstance(consumed, Mapping):
        raise ClaimError(f"device {device}: consumedCapacity is not an object")
    return Share(
        request=request,
        device=device,
        share_id=_name(result.get("shareID") or "", "shareID", required=False),
        memory_bytes=_memory(consumed, device),
        thread_pct=_threads(consumed, device),
        binding_conditions=tuple(str(c) for c in result.get("bindingConditions") or ()),
        admin=result.get("adminAccess") is True,
    )


def _name(value: object, field: str, *, required: bool = True) -> str:
    """A name from the claim, as ``Admit`` takes an identifier (bounded, no control
    characters); the refusal quotes it cut."""
    try:
        return identifier(str(value or ""), field, required=required)
    except ValidationError as exc:
        raise ClaimError(f"{exc} (got {shown(str(value or ''))})") from exc


def _memory(consumed: Mapping[str, Any], device: str) -> int | None:
    """Consumed memory in bytes, within what ``Admit`` takes: 1 MiB (the smallest limit
    MPS can express) to 1 PiB."""
    if "memory" not in consumed:
        return None
    try:
        value = quantity_bytes(str(consumed["memory"]))
    except UnitError as exc:
        raise ClaimError(f"device {device}: consumed memory: {exc}") from exc
    if not MIN_MEMORY_BYTES <= value <= MAX_MEMORY_BYTES:
        raise ClaimError(
            f"device {device}: consumed memory {shown(str(consumed['memory']))} is outside "
            "1Mi to 1Pi (MPS cannot hold a share to it)"
        )
    return value


def _threads(consumed: Mapping[str, Any], device: str) -> float | None:
    """Consumed threads: a percentage in (0, 100], as ``Admit`` takes it."""
    if "threads" not in consumed:
        return None
    try:
        value = float(quantity(str(consumed["threads"])))
    except (UnitError, ValueError, ArithmeticError) as exc:
        raise ClaimError(f"device {device}: consumed threads: {exc}") from exc
    if not 0 < value <= 100:  # NaN fails too
        raise ClaimError(
            f"device {device}: consumed threads {shown(str(consumed['threads']))} is outside "
            "(0, 100] (an MPS active-thread percentage)"
        )
    return value


def share_config(claim: Mapping[str, Any], driver: str, request: str) -> ShareConfig:
    """The opaque ``ShareConfig`` of this driver that applies to ``request`` (entries that
    name no request apply to all), field by field: the class's first, then the claim's,
    later entries win; defaults otherwise."""
    found = allocation(claim) or {}
    entries = ((found.get("devices") or {}).get("config")) or []
    config = ShareConfig()
    for entry in entries:
        opaque = entry.get("opaque") or {}
        scope = [str(r).partition("/")[0] for r in entry.get("requests") or []]
        if opaque.get("driver") == driver and (not scope or request in scope):
            config = _config(opaque.get("parameters") or {}, config)
    return config


def _config(parameters: Mapping[str, Any], base: ShareConfig) -> ShareConfig:
    if parameters.get("kind") != CONFIG_KIND or parameters.get("apiVersion") != CONFIG_API:
        raise ClaimError(f"opaque config for this driver must be {CONFIG_API} {CONFIG_KIND}")
    unknown = sorted(
        set(parameters) - {"apiVersion", "kind", "priority", "profile", "retentionFloor"}
    )
    if unknown:
        named = ", ".join(shown(str(k), 32) for k in unknown[:5])
        raise ClaimError(f"{CONFIG_KIND} has unknown fields {named}")
    priority = parameters.get("priority", base.priority)
    if priority not in PRIORITIES:
        raise ClaimError(f"{CONFIG_KIND}.priority must be one of {', '.join(PRIORITIES)}")
    floor = parameters.get("retentionFloor", base.retention_floor)
    if floor is not None and (
        isinstance(floor, bool) or not isinstance(floor, int | float) or not 0 < floor <= 1
    ):
        raise ClaimError(f"{CONFIG_KIND}.retentionFloor must be in (0, 1]")
    profile = parameters.get("profile", base.profile)
    if profile is not None and not isinstance(profile, str):
        raise ClaimError(f"{CONFIG_KIND}.profile must be a string")
    if profile is not None:
        profile = _name(profile, f"{CONFIG_KIND}.profile")
    return ShareConfig(priority, profile, None if floor is None else float(floor))


def reserved_pods(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, uid) of the pods the claim is reserved for."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return [
        (str(r.get("name") or ""), str(r.get("uid") or ""))
        for r in reserved
        if r.get("resource") == "pods"
    ]


def pending_conditions(claim: Mapping[str, Any], driver: str, pool: str) -> list[Share]:
    """This driver's shares on this node that wait for a binding condition: they carry
    some, and no entry of ``status.devices`` says yet whether they are met."""
    answered = {
        (d.get("device"), d.get("shareID") or "")
        for d in (claim.get("status") or {}).get("devices") or []
        if d.get("driver") == driver and d.get("pool") == pool and d.get("conditions")
    }
    return [
        s
        for s in results_here(claim, driver, pool)
        if s.binding_conditions and (s.device, s.share_id) not in answered
    ]


def refused_here(claim: Mapping[str, Any], driver: str, pool: str) -> bool:
    """Whether the driver refused a share of the claim on this node (a True ``REFUSED``
    condition in its ``status.devices``)."""
    return any(
        c.get("type") == REFUSED and c.get("status") == "True"
        for d in (claim.get("status") or {}).get("devices") or []
        if d.get("driver") == driver and d.get("pool") == pool
        for c in d.get("conditions") or []
    )


def condition(kind: str, reason: str, message: str, at: str) -> Obj:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": at,
    }


def with_device_status(
    claim: Mapping[str, Any], driver: str, pool: str, answers: Sequence[tuple[Share, Obj]]
) -> Obj:
    """The claim with a ``status.devices`` entry per answered share (replacing any entry
    of the same device and share)."""
    status = dict(claim.get("status") or {})
    keys = {(s.device, s.share_id) for s, _ in answers}
    kept = [
        d
        for d in status.get("devices") or []
        if not (
            d.get("driver") == driver
            and d.get("pool") == pool
            and (d.get("device"), d.get("shareID") or "") in keys
        )
    ]
    for share, cond in answers:
        entry: Obj = {"driver": driver, "pool": pool, "device": share.device, "conditions": [cond]}
        if share.share_id:
            entry["shareID"] = share.share_id
        kept.append(entry)
    status["devices"] = kept
    return {**claim, "status": status}
