"""The kubelet device plugin's durable facts (:class:`AllocationRecord`) and what it needs
of the node's store to keep them (:class:`AllocationStore`, a port of its own: the SQLite
store implements it, with rows of its ``allocations`` table, beside the
:class:`~agent.state.port.StateStore` the rest of the agent uses)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple, Protocol

from agent.core.types import Event
from agent.state.port import AllocationRow, WriteBatch


class AllocationKind(StrEnum):
    """What an :class:`AllocationRecord` says happened."""

    GRANTED = "granted"  # a pod lease granted again to its binder: its hold starts again
    ALLOCATED = "allocated"  # the lease handed out: to the share units, or by NRI (no units)
    DEFERRED = "deferred"  # the units answered with the NRI marker: no lease yet
    CHECKED = "checked"  # PreStartContainer found the lease's units with its own pod


class AllocationRecord(NamedTuple):
    """One fact of the kubelet device plugin, in the order they happened: which lease went
    to which share units (the kubelet's device ids, sorted), when a pod lease was granted
    again, which pod was found holding the units. Written before the kubelet (or the
    binder) hears back; read back at start. A row of the store's ``allocations`` table."""

    kind: AllocationKind
    at: float
    lease_id: str = ""
    units: tuple[str, ...] = ()
    pod: str = ""  # "<namespace>/<name>", once known

    @classmethod
    def from_row(cls, row: AllocationRow) -> AllocationRecord:
        return cls(AllocationKind(row.kind), row.at, row.lease_id, row.units, row.pod)

    def as_row(self) -> AllocationRow:
        return AllocationRow(self.kind.value, self.at, self.lease_id, self.units, self.pod)


class AllocationStore(Protocol):
    """The node's store as the pod allocations use it: records are written with a batch
    (``WriteBatch.allocations``, in the same transaction as its events), read back at
    start, and pruned with their lease by the store's own pruner."""

    async def commit(self, batch: WriteBatch) -> list[Event]: ...

    async def allocation_records(self) -> Sequence[AllocationRow]:
        """Every allocation record kept, oldest first (read in pages)."""
        ...
