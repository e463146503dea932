"""What the kubelet device plugin has handed out, as the fold of its durable records.

Each fact (:class:`~agent.legacy.deviceplugin.records.AllocationRecord`) is applied here
only once it is on disk, and the same fold rebuilds the book from the store at start. So
the book after a restart is the book before it: a lease handed to some share units is
never handed to another pod, a hold that a repeated grant started again still runs from
that grant, and units deferred to the NRI plugin are still known as such.

Leases being written (``hold``) count as handed out until their write settles, so two
Allocate calls never pick the same lease, whatever happens to either caller meanwhile.
Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from agent.legacy.deviceplugin.records import AllocationKind, AllocationRecord

DEFERRED = ""  # what the units' entry holds when they were answered with the NRI marker
KEPT = 10_000  # entries kept per map before those of leases no longer live are dropped


class AllocationBook:
    def __init__(self) -> None:
        self._handed: dict[str, None] = {}  # leases handed out, oldest first
        self._writing: dict[str, int] = {}  # leases whose allocation is being written
        self._by_units: dict[frozenset[str], str] = {}  # units -> lease id, or DEFERRED
        self._granted: dict[str, float] = {}  # lease id -> its latest repeated grant
        self._pods: dict[str, str] = {}  # lease id -> the pod found holding its units

    @classmethod
    def replay(cls, records: Iterable[AllocationRecord]) -> AllocationBook:
        book = cls()
        for record in records:
            book.apply(record)
        return book

    # -- facts ----------------------------------------------------------------------------

    def apply(self, record: AllocationRecord) -> None:
        """Make one durable record true here (records apply in the order they happened)."""
        kind, units = record.kind, frozenset(record.units)
        if kind is AllocationKind.ALLOCATED:
            self._handed[record.lease_id] = None
            if units:
                self._by_units.pop(units, None)  # newest last
                self._by_units[units] = record.lease_id
            if record.pod:
                self._pods[record.lease_id] = record.pod
        elif kind is AllocationKind.DEFERRED:
            self._by_units.pop(units, None)
            self._by_units[units] = DEFERRED
        elif kind is AllocationKind.GRANTED:
            self._granted[record.lease_id] = max(
                record.at, self._granted.get(record.lease_id, record.at)
            )
        elif kind is AllocationKind.CHECKED:
            self._pods[record.lease_id] = record.pod

    def hold(self, lease_id: str) -> None:
        """``lease_id`` is being handed out: no one else gets it while its write runs."""
        self._writing[lease_id] = self._writing.get(lease_id, 0) + 1

    def unhold(self, lease_id: str) -> None:
        """Its write settled (applied, or failed and so never true)."""
        left = self._writing.get(lease_id, 0) - 1
        if left > 0:
            self._writing[lease_id] = left
        else:
            self._writing.pop(lease_id, None)

    def forget_all_but(self, live: Collection[str]) -> None:
        """Drop what is known of leases not in ``live`` (they ended: no Allocate can get
        them again), keeping deferred units and the units of live leases."""
        self._handed = {i: None for i in self._handed if i in live}
        self._granted = {i: t for i, t in self._granted.items() if i in live}
        self._pods = {i: p for i, p in self._pods.items() if i in live}
        self._by_units = {u: i for u, i in self._by_units.items() if i == DEFERRED or i in live}
        while len(self._by_units) > KEPT:  # deferred units of pods long gone
            del self._by_units[next(iter(self._by_units))]

    # -- questions ------------------------------------------------------------------------

    @property
    def taken(self) -> Collection[str]:
        """Leases handed out or being handed out: Allocate skips them."""
        return self._handed.keys() | self._writing.keys()

    def handed_out(self, lease_id: str) -> bool:
        return lease_id in self._handed

    def size(self) -> int:
        return max(len(self._handed), len(self._by_units), len(self._granted))

    def lease_of(self, units: frozenset[str]) -> str | None:
        """The lease last handed to these units; None when unknown or deferred."""
        lease_id = self._by_units.get(units)
        return lease_id or None

    def deferred(self, units: frozenset[str]) -> bool:
        """These units were last answered with the NRI marker."""
        return self._by_units.get(units) == DEFERRED

    @property
    def granted_at(self) -> Mapping[str, float]:
        """Each lease's latest repeated grant (its admission is the lease's own time)."""
        return self._granted

    def pod_of(self, lease_id: str) -> str:
        """The pod found holding the lease's units, or "" while not known."""
        return self._pods.get(lease_id, "")
