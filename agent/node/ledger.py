"""The ledger: the live leases of the node and what they commit per device.

It has one job. Every change is compare-and-set on a lease's version: ``take`` adds a new
lease (capacity taken at decision time), ``untake`` removes exactly that lease again (a
failed write; never a blind put-back), and ``apply`` installs changes that are durable,
refusing any computed from a version that is no longer current. Leases with a write in
flight are ``busy``: a transition waits for that write before it decides, and a
preemption never picks them. Per-device tallies, trust domains and known UIDs (leases
without a ``run_as_uid`` do not count) are kept incrementally. Ended leases and request ids
are remembered in bounded maps; older ones are read from the store.

A gang's reserved members are committed all or none. A gang's round of reservations lasts
while it holds reserved members; the moment one of them ends otherwise than by the gang's
commit or abort (its TTL passed, it was released), in the same step that applies that end,
the round is marked uncommittable, naming the member, so a commit decided after that step
commits none of it, whoever ended the member and however the calls interleave. Once no
member is reserved (committed, aborted, expired), the gang's id may start a new round:
members committed before do not hold it open. Its last outcome (``expired``, ``broken``,
``aborted``, ``committed``) is kept in a bounded map to answer a commit or abort asked
again.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from agent.admission.policy import Tally
from agent.core.errors import LeaseTransitionError
from agent.core.lease import Lease, LeaseState
from agent.state.port import RequestRecord

ENDED_KEPT = 10_000  # ended leases remembered in memory
REQUESTS_KEPT = 100_000  # request ids of ended leases remembered in memory
GANGS_KEPT = 10_000  # recent gang outcomes ("expired", "broken", "aborted", "committed")
RequestKey = tuple[str, str]  # (tenant, request id)
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class GangEnd:
    """What became of a gang: ``expired`` (a member's TTL passed before the commit),
    ``broken`` (a member ended otherwise before the commit) or ``aborted``; ``member`` is
    the lease that ended first, with its state, when one did on its own."""

    outcome: str
    member: str = ""

    def why(self, gang_id: str) -> str:
        if self.outcome == "expired":
            text = f"gang {gang_id!r} expired before it was committed"
        else:
            text = f"gang {gang_id!r} was {self.outcome} before it was committed"
        return f"{text} ({self.member})" if self.member else text


class Ledger:
    def __init__(self, device_uuids: Iterable[str]) -> None:
        self._live: dict[str, Lease] = {}
        self._by_device: dict[str, dict[str, Lease]] = {uuid: {} for uuid in device_uuids}
        self._tally: dict[str, Tally] = {uuid: Tally() for uuid in self._by_device}
        self._ended: OrderedDict[str, Lease] = OrderedDict()
        self._busy: dict[str, asyncio.Future[object]] = {}
        self._pinned: frozenset[str] | None = frozenset()  # cache of the busy ids
        self._tuples: dict[str, tuple[Lease, ...]] = {}  # cache of on_device
        self._domains: dict[str, Counter[str]] = {uuid: Counter() for uuid in self._by_device}
        self._users: dict[str, Counter[int]] = {uuid: Counter() for uuid in self._by_device}
        self._requests: dict[RequestKey, RequestRecord] = {}  # of live leases
        self._ended_requests: OrderedDict[RequestKey, RequestRecord] = OrderedDict()
        self.requests_complete = True  # every known request id is in memory
        self.gangs: OrderedDict[str, GangEnd] = OrderedDict()
        self._gang_reserved: Counter[str] = Counter()  # reserved members per gang
        self._broken: dict[str, GangEnd] = {}  # rounds that lost a reserved member
        self.live: Mapping[str, Lease] = MappingProxyType(self._live)

    # -- reading ---------------------------------------------------------------------------

    def get(self, lease_id: str) -> Lease | None:
        return self._live.get(lease_id) or self._ended.get(lease_id)

    def on_device(self, device_uuid: str) -> tuple[Lease, ...]:
        leases = self._tuples.get(device_uuid)
        if leases is None:
            leases = tuple(self._by_device.get(device_uuid, {}).values())
            self._tuples[device_uuid] = leases
        return leases

    def domains(self, device_uuid: str) -> frozenset[str]:
        """The trust domains of the leases on a device."""
        return frozenset(self._domains.get(device_uuid, ()))

    def users(self, device_uuid: str) -> frozenset[int]:
        """The known UIDs of the leases on a device (a lease without one does not count)."""
        return frozenset(self._users.get(device_uuid, ()))

    def tally(self, device_uuid: str) -> Tally:
        return self._tally.get(device_uuid, Tally())

    def gang(self, gang_id: str) -> list[Lease]:
        return [x for x in self._live.values() if x.gang_id == gang_id]

    def ended_gang(self, gang_id: str) -> list[Lease]:
        return [x for x in self._ended.values() if x.gang_id == gang_id]

    def request(self, key: RequestKey) -> RequestRecord | None:
        return self._requests.get(key) or self._ended_requests.get(key)

    # -- writes in flight ------------------------------------------------------------------

    def busy(self, lease_ids: Iterable[str]) -> list[asyncio.Future[object]]:
        return [f for i in lease_ids if (f := self._busy.get(i)) is not None]

    def pinned(self) -> frozenset[str]:
        if self._pinned is None:
            self._pinned = frozenset(self._busy)
        return self._pinned

    def hold(self, lease_ids: Iterable[str], write: asyncio.Future[object]) -> None:
        for lease_id in lease_ids:
            self._busy[lease_id] = write
        self._pinned = None

    def free(self, lease_ids: Iterable[str], write: asyncio.Future[object]) -> None:
        for lease_id in lease_ids:
            if self._busy.get(lease_id) is write:
                del self._busy[lease_id]
        self._pinned = None

    # -- changing --------------------------------------------------------------------------

    def take(self, lease: Lease, record: RequestRecord | None = None) -> None:
        """A new lease holds its capacity from the moment it is decided."""
        if lease.lease_id in self._live or not lease.state.holds_capacity:
            raise LeaseTransitionError(f"lease {lease.lease_id} cannot be taken twice")
        self._add(lease)
        if record is not None:
            self._requests[(record.tenant, record.request_id)] = record

    def untake(self, lease: Lease, record: RequestRecord | None = None) -> bool:
        """Remove ``lease`` if the ledger still holds exactly it (its write failed)."""
        current = self._live.get(lease.lease_id)
        if current is None or current.version != lease.version:
            return False
        self._remove(current)
        if record is not None:
            key = (record.tenant, record.request_id)
            if self._requests.get(key) is record:
                del self._requests[key]
        return True

    def apply(self, changes: Sequence[Lease]) -> None:
        """Install durable changes; each must follow the version it was computed from."""
        for change in changes:
            current = self._live.get(change.lease_id)
            if current is None and change.version == 1 and change.state.holds_capacity:
                self._add(change)  # new, written before it was applied (a preemption)
                continue
            if current is None or current.version != change.version - 1:
                seen = "gone" if current is None else f"at version {current.version}"
                raise LeaseTransitionError(
                    f"lease {change.lease_id}: version {change.version} applied but it is {seen}"
                )
            self._remove(current)
            if change.state.holds_capacity:
                self._add(change)
            else:
                self._end(change)
                if current.state is LeaseState.RESERVED and change.gang_id:
                    self._member_lost(change.gang_id, change)

    def restore(self, lease: Lease, record: RequestRecord | None) -> None:
        """At start: a live lease read back from the store."""
        self.take(lease, record)

    def remember_request(self, record: RequestRecord) -> None:
        key = (record.tenant, record.request_id)
        if record.lease_id in self._live:
            self._requests[key] = record
        else:
            self._remember_ended_request(key, record)

    def remember_gang(self, gang_id: str, outcome: str, member: str = "") -> None:
        self.gangs[gang_id] = GangEnd(outcome, member)
        self.gangs.move_to_end(gang_id)
        while len(self.gangs) > GANGS_KEPT:
            self.gangs.popitem(last=False)

    def uncommittable(self, gang_id: str) -> GangEnd | None:
        """Why the reserved members of this gang may not be committed (one of their round
        ended while reserved); None if nothing stands in the way."""
        return self._broken.get(gang_id)

    def restore_broken(self, gang_id: str, end: GangEnd) -> None:
        """At start: the store shows that this gang's round lost a reserved member."""
        if self._gang_reserved[gang_id]:
            self._broken.setdefault(gang_id, end)

    def _member_lost(self, gang_id: str, lease: Lease) -> None:
        """A reserved member ended: the first one of the round says why the others cannot
        commit. An abort ends them all (the round is over, nothing is left to refuse) and
        records its own outcome once its write is durable."""
        end = self._broken.get(gang_id)
        if end is None:
            outcome = "expired" if lease.state is LeaseState.EXPIRED else "broken"
            detail = f"member {lease.lease_id} {lease.state.value}"
            end = GangEnd(outcome, f"{detail}: {lease.reason}" if lease.reason else detail)
        if self._gang_reserved[gang_id]:
            self._broken[gang_id] = end
        self.remember_gang(gang_id, end.outcome, end.member)

    # -- internals -------------------------------------------------------------------------

    def _add(self, lease: Lease) -> None:
        uuid = lease.device_uuid
        self._live[lease.lease_id] = lease
        self._by_device.setdefault(uuid, {})[lease.lease_id] = lease
        self._tally[uuid] = self.tally(uuid).plus(lease)
        self._domains.setdefault(uuid, Counter())[lease.trust_domain] += 1
        if lease.run_as_uid is not None:
            self._users.setdefault(uuid, Counter())[lease.run_as_uid] += 1
        self._tuples.pop(uuid, None)
        if lease.gang_id and lease.state is LeaseState.RESERVED:
            self._gang_reserved[lease.gang_id] += 1

    def _remove(self, lease: Lease) -> None:
        uuid = lease.device_uuid
        del self._live[lease.lease_id]
        del self._by_device[uuid][lease.lease_id]
        self._tally[uuid] = self.tally(uuid).minus(lease)
        _uncount(self._domains[uuid], lease.trust_domain)
        if lease.run_as_uid is not None:
            _uncount(self._users[uuid], lease.run_as_uid)
        self._tuples.pop(uuid, None)
        if lease.gang_id and lease.state is LeaseState.RESERVED:
            self._gang_reserved[lease.gang_id] -= 1
            if self._gang_reserved[lease.gang_id] <= 0:  # the round is over
                del self._gang_reserved[lease.gang_id]
                self._broken.pop(lease.gang_id, None)

    def _end(self, lease: Lease) -> None:
        self._ended[lease.lease_id] = lease
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)
        key = (lease.tenant, lease.request_id)
        record = self._requests.pop(key, None)
        if record is not None:
            self._remember_ended_request(key, record)

    def _remember_ended_request(self, key: RequestKey, record: RequestRecord) -> None:
        self._ended_requests[key] = record
        while len(self._ended_requests) > REQUESTS_KEPT:
            self._ended_requests.popitem(last=False)
            self.requests_complete = False

    def forget_requests_before(self, at: float) -> None:
        """Drop ended leases' request ids older than ``at`` (the store prunes the same)."""
        ended = self._ended_requests
        while ended and next(iter(ended.values())).at < at:  # oldest first: O(1) a step
            ended.popitem(last=False)


def _uncount(counts: Counter[K], key: K) -> None:
    """One fewer ``key``; a key with none left is gone (the views list what is there)."""
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]


def lost_in_this_round(
    gang_id: str, stored: Iterable[Lease], reserved: Sequence[Lease]
) -> GangEnd | None:
    """After a restart: did the gang's round that its ``reserved`` members belong to lose
    one? From its members as stored: one that ended by its first change (reserved, then
    expired or released, but not by the gang's abort) no earlier than the oldest reserved
    member was made. Times that tie count it lost: a commit refused is safe, a gang
    committed in part is not."""
    if not reserved:
        return None
    began_at = min(x.created_at for x in reserved)
    aborted = f"gang {gang_id} aborted"
    for lease in sorted(stored, key=lambda x: x.updated_at):
        lost = lease.version == 2 and lease.state in (LeaseState.EXPIRED, LeaseState.RELEASED)
        if lost and lease.reason != aborted and lease.updated_at >= began_at:
            outcome = "expired" if lease.state is LeaseState.EXPIRED else "broken"
            return GangEnd(outcome, f"member {lease.lease_id} {lease.state.value}")
    return None
