"""Port of the state domain: the durable store of leases and events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agent.core.lease import Lease
from agent.core.types import Event, HistoryRow


class StateStore(Protocol):
    """Leases and events on disk. ``commit`` returns once they are durable (fsync'd);
    concurrent commits share one sync (group commit)."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def commit(self, leases: Sequence[Lease], events: Sequence[Event]) -> None: ...

    async def live_leases(self) -> list[Lease]: ...

    async def lease_by_request(self, request_id: str) -> Lease | None: ...

    async def request_index(self) -> dict[str, str]:
        """Every request id ever admitted, with its lease id (for idempotency)."""
        ...

    async def events_since(self, seq: int, *, limit: int) -> list[Event]: ...

    async def last_event_seq(self) -> int: ...

    async def set_drained(self, device_uuid: str, reason: str | None, *, at: float) -> None: ...

    async def drained(self) -> dict[str, str]: ...

    async def history(self, *, since: float = 0.0, limit: int = 1_000_000) -> list[HistoryRow]:
        """Leases that ended (oldest first): the readiness predictor's training rows."""
        ...

    async def heartbeat(self, *, at: float) -> None:
        """A tiny durable write: proves (or disproves) that the store can write."""
        ...

    def writable(self) -> bool: ...
