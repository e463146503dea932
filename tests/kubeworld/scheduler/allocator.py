"""A pure stand-in for the structured-parameters allocator of kube-scheduler's
DynamicResources plugin (the ``incubating`` one: consumable capacity, binding conditions,
device taints), for node-local ResourceSlices. No I/O: it takes the slices, the device
classes and the claims already allocated, as the API returns them, and answers the
``status.allocation`` of the claims to allocate on one node, or raises
:class:`AllocationError` saying why not.

    allocation = allocate_claim(claim, "node-a", slices=..., classes=..., allocated=...)

The rules (R1-R14 of the driver anatomy's allocator section), as implemented here:

- R1: only complete pools (as many slices at the pool's highest generation as its
  ``resourceSliceCount``) are used; first fit with backtracking, pools ordered with those
  whose devices have binding conditions last, then by pool name and driver; slices by
  name; devices in listed order. A request slot tries every device from the start again.
- R2: existing results with ``adminAccess`` are ignored; one with ``shareID`` adds its
  ``consumedCapacity`` to the device's total; one without makes the device exclusive.
- R3: an exclusive device is never picked, except by an ``adminAccess`` request; a
  dedicated device (no ``allowMultipleAllocations``) in any use is not picked either.
- R4: a request naming a capacity the device lacks skips the device.
- R5: the consumed amount: not requested -> ``default``, else the full ``value``; no policy
  -> as requested; ``validRange``: below ``min`` -> ``min``, with ``step``
  ``min + ceil((req - min) / step) * step`` on whole units (Go's ``Value()``, fractions
  round up), printed BinarySI; ``validValues``: the smallest value >= the request, else
  the request.
- R6: the amount passes if it equals ``default``; otherwise it fails above ``max``, off
  the ``step`` grid, or outside ``validValues``.
- R7: existing total + this call's earlier picks + the amount <= ``value``, per capacity.
- R8: a dedicated device: R4-R7 against its whole value, no ``shareID``, no
  ``consumedCapacity``, and it is exclusive afterwards (also within this call).
- R9: a shared pick gets a fresh ``shareID`` (uuid4) and ``consumedCapacity`` lists every
  capacity of the device; one device serves several claims and several requests of one
  claim, but the ``count`` devices of one request are distinct.
- R10: ``distinctAttribute`` (and ``matchAttribute``) constraints, attribute by full name
  or by short name in the driver's domain; distinct values are remembered per request
  name, so a request with ``count > 1`` remembers only its last pick (as observed in the
  real one).
- R11: an untolerated ``NoSchedule``/``NoExecute`` taint excludes the device (tolerations
  ``Exists``/``Equal``, key, value, effect); the request's tolerations are copied into its
  results.
- R12: ``allocationMode: All``: every selectable, tolerated device of the node's pools
  whose R4-R7 check passes (the others are left out silently); none, an incomplete pool,
  or one of them in exclusive use fails the request.
- R13: shared counters (``sharedCounters`` / ``consumesCounters``) are checked for a device
  not in use yet; a shared device already in use skips the check.
- R14: ``nodeSelector`` is ``matchFields metadata.name In [node]`` when a picked device
  is node-local or ``bindsToNode``; binding conditions are copied from the device, and
  ``allocationTimestamp`` is set when any result has them; ``devices.config`` holds each
  request's class config (``FromClass``) and then the claim's (``FromClaim``).

Not covered (refused or left out): ``firstAvailable`` sub-requests (refused), slices
selected by ``nodeSelector`` or per-device node selection (ignored), DeviceTaintRules,
scoring. Device selectors are the CEL subset of :mod:`tests.kubeworld.scheduler.selectors`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.kubeworld.quantity import ZERO, Quantity
from tests.kubeworld.scheduler.allocator_rules import (
    Candidate,
    Constraint,
    DeviceKey,
    consumed_amounts,
    fits,
    parse_constraints,
    tolerated,
)
from tests.kubeworld.scheduler.claims import Obj
from tests.kubeworld.scheduler.selectors import (
    DeviceView,
    Predicate,
    SelectorRuntimeError,
    UnsupportedSelector,
    compile_selector,
)

CANNOT_ALLOCATE = "cannot allocate all claims"


class AllocationError(Exception):
    """Why the claims cannot be allocated on the node (``str()`` is the reason)."""


class CannotAllocate(AllocationError):
    def __init__(self, reason: str = CANNOT_ALLOCATE) -> None:
        super().__init__(reason)


class InvalidClaim(AllocationError):
    """The claim or its class cannot be handled at all: a missing class, a selector this
    stand-in cannot read or whose evaluation failed, an unsupported request form."""


# -- the node's pools ----------------------------------------------------------------------


@dataclass
class Pool:
    driver: str
    name: str
    complete: bool
    candidates: list[Candidate]
    counter_sets: dict[str, dict[str, Quantity]]

    @property
    def binding(self) -> bool:
        return any(c.device.get("bindingConditions") for c in self.candidates)


def gather_pools(slices: Iterable[Obj], node: str) -> list[Pool]:
    """R1: the pools of the slices usable on ``node`` (its own and ``allNodes`` ones), in
    allocation order, each marked complete or not."""
    groups: dict[tuple[str, str], list[Obj]] = {}
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        if spec.get("nodeName") == node or spec.get("allNodes"):
            groups.setdefault((spec["driver"], spec["pool"]["name"]), []).append(slice_)
    pools = [_pool(driver, name, group) for (driver, name), group in groups.items()]
    return sorted(pools, key=lambda p: (p.binding, p.name, p.driver))


def pool_keys(slices: Iterable[Obj], node: str) -> set[tuple[str, str]]:
    """(driver, pool) of the slices usable on ``node``: the pools whose allocated claims
    :func:`allocate` needs to know of there (a claim's usage counts only on its devices)."""
    return {
        (spec["driver"], spec["pool"]["name"])
        for slice_ in slices
        if (spec := slice_.get("spec") or {}).get("nodeName") == node or spec.get("allNodes")
    }


def claim_pool_keys(claim: Obj) -> set[tuple[str, str]]:
    """(driver, pool) of each device a claim is allocated."""
    return {(r["driver"], r["pool"]) for r in _results(claim) if "driver" in r and "pool" in r}


def _pool(driver: str, name: str, group: list[Obj]) -> Pool:
    newest = max(int(s["spec"]["pool"].get("generation", 0)) for s in group)
    current = sorted(
        (s for s in group if int(s["spec"]["pool"].get("generation", 0)) == newest),
        key=lambda s: s["metadata"]["name"],
    )
    wanted = int(current[0]["spec"]["pool"].get("resourceSliceCount", 1))
    candidates = [
        Candidate(
            (driver, name, device["name"]),
            device,
            DeviceView.of(driver, device),
            bool(s["spec"].get("nodeName")),
        )
        for s in current
        for device in s["spec"].get("devices") or []
    ]
    counter_sets = {
        entry["name"]: {n: Quantity.parse(c["value"]) for n, c in entry["counters"].items()}
        for s in current
        for entry in s["spec"].get("sharedCounters") or []
    }
    return Pool(driver, name, len(current) == wanted, candidates, counter_sets)


# -- what is in use ------------------------------------------------------------------------


@dataclass
class Usage:
    """R2: the devices in use by allocated claims."""

    exclusive: set[DeviceKey] = field(default_factory=set)
    shared: dict[DeviceKey, dict[str, Quantity]] = field(default_factory=dict)

    @classmethod
    def of(cls, claims: Iterable[Obj], skip_uids: Iterable[str] = ()) -> Usage:
        usage, skipped = cls(), set(skip_uids)
        for claim in claims:
            if claim["metadata"].get("uid") in skipped:
                continue
            for result in _results(claim):
                usage.add(result)
        return usage

    def add(self, result: Mapping[str, Any]) -> None:
        if result.get("adminAccess"):
            return
        key = (result["driver"], result["pool"], result["device"])
        if not result.get("shareID"):
            self.exclusive.add(key)
            return
        total = self.shared.setdefault(key, {})
        for name, amount in (result.get("consumedCapacity") or {}).items():
            total[name] = total.get(name, ZERO) + Quantity.parse(amount)

    def in_use(self, key: DeviceKey) -> bool:
        return key in self.exclusive or key in self.shared


def _results(claim: Obj) -> list[Obj]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


# -- requests ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Request:
    claim: int  # index into the claims being allocated
    name: str
    selectors: tuple[Predicate, ...]
    all_devices: bool
    count: int
    admin: bool
    tolerations: tuple[Obj, ...]
    capacity: Mapping[str, Quantity]
    class_config: tuple[Obj, ...]


def parse_requests(index: int, claim: Obj, classes: Mapping[str, Obj]) -> list[Request]:
    return [
        _request(index, claim, r, classes)
        for r in claim["spec"].get("devices", {}).get("requests") or []
    ]


def _request(index: int, claim: Obj, request: Obj, classes: Mapping[str, Obj]) -> Request:
    name, exact = request["name"], request.get("exactly")
    where = f"claim {_name(claim)}, request {name}"
    if exact is None:
        raise InvalidClaim(f"{where}: only 'exactly' requests are supported (no firstAvailable)")
    device_class = classes.get(exact.get("deviceClassName", ""))
    if device_class is None:
        raise InvalidClaim(f"{where}: device class {exact.get('deviceClassName')} does not exist")
    expressions = [
        s["cel"]["expression"]
        for s in [*(device_class["spec"].get("selectors") or []), *(exact.get("selectors") or [])]
    ]
    try:
        selectors = tuple(compile_selector(e) for e in expressions)
    except UnsupportedSelector as exc:
        raise InvalidClaim(f"{where}: {exc}") from None
    requested = (exact.get("capacity") or {}).get("requests") or {}
    return Request(
        claim=index,
        name=name,
        selectors=selectors,
        all_devices=exact.get("allocationMode", "ExactCount") == "All",
        count=int(exact.get("count", 1)),
        admin=bool(exact.get("adminAccess")),
        tolerations=tuple(exact.get("tolerations") or ()),
        capacity={n: Quantity.parse(v) for n, v in requested.items()},
        class_config=tuple(device_class["spec"].get("config") or ()),
    )


def _name(claim: Obj) -> str:
    meta = claim["metadata"]
    return f"{meta.get('namespace', '')}/{meta.get('name', meta.get('generateName', ''))}"


# -- the search ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Pick:
    request: Request
    candidate: Candidate
    consumed: dict[str, Quantity]  # of every capacity of the device

    @property
    def shared(self) -> bool:
        """R9 (a share of the device) rather than R8 (the whole device) or admin access."""
        return self.candidate.multiple and not self.request.admin


Slot = tuple[Request, Candidate | None]  # a device to find, or (allocationMode All) to take


class Search:
    """First fit with backtracking over request slots (R1), with the checks of R3-R13."""

    def __init__(
        self, pools: list[Pool], usage: Usage, constraints: Mapping[int, list[Constraint]]
    ) -> None:
        self.pools, self.usage, self.constraints = pools, usage, constraints
        self.pool_of = {c.key: p for p in pools for c in p.candidates}
        self.ordered = [c for p in pools if p.complete for c in p.candidates]
        self.picks: list[Pick] = []
        self._selectable: dict[tuple[int, DeviceKey], bool] = {}

    def solve(self, slots: Sequence[Slot], index: int = 0) -> bool:
        if index == len(slots):
            return True
        request, pinned = slots[index]
        for candidate in [pinned] if pinned is not None else self.ordered:
            if pinned is None and not self.selectable(request, candidate):
                continue
            pick = self.take(request, candidate)
            if pick is not None and self.solve(slots, index + 1):
                return True
            if pick is not None:
                self.undo(pick)
            if pinned is not None:
                return False  # All: each device in turn, no alternative
        return False

    def selectable(self, request: Request, candidate: Candidate) -> bool:
        """The class's and the request's selectors, and R4, R11."""
        cache_key = (id(request), candidate.key)
        if cache_key not in self._selectable:
            try:
                matches = all(s(candidate.view) for s in request.selectors)
            except SelectorRuntimeError as exc:
                raise InvalidClaim(f"request {request.name}: CEL runtime error: {exc}") from None
            capacity = candidate.device.get("capacity") or {}
            known = all(name in capacity for name in request.capacity)
            self._selectable[cache_key] = (
                matches and known and tolerated(candidate.device, request.tolerations)
            )
        return self._selectable[cache_key]

    def take(self, request: Request, candidate: Candidate) -> Pick | None:
        """``candidate`` picked for ``request``, or None when a check refuses it."""
        if not request.admin and not self.free(request, candidate):
            return None
        consumed = self.consumption(request, candidate)
        if consumed is None or not self.counters_fit(candidate):
            return None
        pick = Pick(request, candidate, consumed)
        added: list[Constraint] = []
        for constraint in self.constraints.get(request.claim, []):
            if not constraint.add(request.name, candidate):
                for done in added:
                    done.remove(request.name, candidate)
                return None
            added.append(constraint)
        self.picks.append(pick)
        return pick

    def undo(self, pick: Pick) -> None:
        self.picks.remove(pick)
        for constraint in self.constraints.get(pick.request.claim, []):
            constraint.remove(pick.request.name, pick.candidate)

    def free(self, request: Request, candidate: Candidate) -> bool:
        """R3, R8, R9: not exclusive, a dedicated device not in use, and not picked by
        this request already."""
        key = candidate.key
        if key in self.usage.exclusive:
            return False
        picked = [p for p in self.picks if p.candidate.key == key and not p.request.admin]
        if any(p.request is request or not p.shared for p in picked):
            return False
        return candidate.multiple or not (picked or self.usage.in_use(key))

    def consumption(self, request: Request, candidate: Candidate) -> dict[str, Quantity] | None:
        """R4-R8: the amounts ``candidate`` gives ``request`` ({} when it has no
        capacity), or None when it cannot."""
        amounts = consumed_amounts(candidate.device, request.capacity)
        if amounts is None:
            return None
        if request.admin or not candidate.multiple:
            return amounts if fits(candidate.device, amounts, {}) else None
        return amounts if fits(candidate.device, amounts, self.used(candidate.key)) else None

    def used(self, key: DeviceKey) -> dict[str, Quantity]:
        total = dict(self.usage.shared.get(key, {}))
        for pick in self.picks:
            if pick.candidate.key == key and pick.shared:
                for name, amount in pick.consumed.items():
                    total[name] = total.get(name, ZERO) + amount
        return total

    def in_use(self, key: DeviceKey) -> bool:
        return self.usage.in_use(key) or any(
            p.candidate.key == key and not p.request.admin for p in self.picks
        )

    def counters_fit(self, candidate: Candidate) -> bool:
        """R13: the pool's shared counters still cover a device not in use yet."""
        wanted = candidate.device.get("consumesCounters") or []
        if not wanted or self.in_use(candidate.key):
            return True
        pool = self.pool_of[candidate.key]
        left = {name: dict(counters) for name, counters in pool.counter_sets.items()}
        users = [c for c in pool.candidates if self.in_use(c.key)]  # candidate is not
        for device in [*users, candidate]:
            for entry in device.device.get("consumesCounters") or []:
                counters = left.get(entry["counterSet"])
                if counters is None:
                    return False
                for name, amount in entry["counters"].items():
                    remaining = counters.get(name, ZERO).milli
                    counters[name] = Quantity(remaining - Quantity.parse(amount["value"]).milli)
        return all(q.milli >= 0 for counters in left.values() for q in counters.values())

    def all_devices(self, request: Request) -> list[Candidate]:
        """R12: the devices an ``allocationMode: All`` request takes."""
        found: list[Candidate] = []
        for pool in self.pools:
            if not pool.complete:
                raise CannotAllocate(f"resource pool {pool.name} is currently being updated")
            for candidate in pool.candidates:
                if self.selectable(request, candidate) and self.serves(request, candidate):
                    found.append(candidate)
        if not found:
            raise CannotAllocate(f"request {request.name}: asks for all devices, none matches")
        return found

    def serves(self, request: Request, candidate: Candidate) -> bool:
        amounts = consumed_amounts(candidate.device, request.capacity)
        shared = candidate.multiple and not request.admin
        used = self.usage.shared.get(candidate.key, {}) if shared else {}
        return amounts is not None and fits(candidate.device, amounts, used)


# -- results -------------------------------------------------------------------------------


def allocate(
    claims: Sequence[Obj],
    node: str,
    *,
    slices: Iterable[Obj],
    classes: Iterable[Obj],
    allocated: Iterable[Obj] = (),
    now: datetime | None = None,
    new_share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> list[Obj]:
    """The ``status.allocation`` of each of ``claims`` (in order), all on ``node``, given
    the ``allocated`` claims; raises :class:`AllocationError` when there is none."""
    by_class = {c["metadata"]["name"]: c for c in classes}
    requests = [r for i, claim in enumerate(claims) for r in parse_requests(i, claim, by_class)]
    usage = Usage.of(allocated, skip_uids=(c["metadata"].get("uid") for c in claims))
    constraints = {i: parse_constraints(claim) for i, claim in enumerate(claims)}
    search = Search(gather_pools(slices, node), usage, constraints)
    slots: list[Slot] = []
    for request in requests:
        if request.all_devices:
            slots.extend((request, c) for c in search.all_devices(request))
        else:
            slots.extend([(request, None)] * request.count)
    if not search.solve(slots):
        raise CannotAllocate()
    moment = now or datetime.now(UTC)
    return [
        allocation_of(
            claim,
            [r for r in requests if r.claim == i],
            [p for p in search.picks if p.request.claim == i],
            node,
            moment,
            new_share_id,
        )
        for i, claim in enumerate(claims)
    ]


def allocate_claim(claim: Obj, node: str, **options: Any) -> Obj:
    """:func:`allocate` for one claim."""
    return allocate([claim], node, **options)[0]


def allocation_of(
    claim: Obj,
    requests: Sequence[Request],
    picks: Sequence[Pick],
    node: str,
    moment: datetime,
    new_share_id: Callable[[], str],
) -> Obj:
    """R14: the claim's ``status.allocation`` from its picks."""
    devices: Obj = {"results": [device_result(p, new_share_id) for p in picks]}
    config = [
        {"source": "FromClass", "requests": [r.name], **entry}
        for r in requests
        for entry in r.class_config
    ]
    config += [
        {"source": "FromClaim", **entry}
        for entry in claim["spec"].get("devices", {}).get("config") or []
    ]
    if config:
        devices["config"] = config
    allocation: Obj = {"devices": devices}
    if any(p.candidate.node_local or p.candidate.device.get("bindsToNode") for p in picks):
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        allocation["nodeSelector"] = {"nodeSelectorTerms": [term]}
    if any(p.candidate.device.get("bindingConditions") for p in picks):
        allocation["allocationTimestamp"] = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return allocation


def device_result(pick: Pick, share: Callable[[], str]) -> Obj:
    driver, pool, name = pick.candidate.key
    device = pick.candidate.device
    result: Obj = {"request": pick.request.name, "driver": driver, "pool": pool, "device": name}
    if pick.request.admin:
        result["adminAccess"] = True
    if pick.request.tolerations:
        result["tolerations"] = [dict(t) for t in pick.request.tolerations]
    if conditions := device.get("bindingConditions"):
        result["bindingConditions"] = list(conditions)
        result["bindingFailureConditions"] = list(device.get("bindingFailureConditions") or [])
    if pick.shared:
        result["shareID"] = share()
        if pick.consumed:
            result["consumedCapacity"] = {n: str(a) for n, a in pick.consumed.items()}
    return result
