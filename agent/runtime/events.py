"""The node's event log: every action and observation, numbered, kept in memory and logged
as an audit line. (Durable storage and streaming to the scheduler come with the state
store.)"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

from agent.core.types import Event

audit = logging.getLogger("gpushare.audit")


class EventLog:
    def __init__(self, *, capacity: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self._events: deque[Event] = deque(maxlen=capacity)
        self._seq = 0
        self._clock = clock

    def __call__(
        self,
        kind: str,
        message: str,
        *,
        device_uuid: str | None = None,
        lease_id: str | None = None,
        attrs: Mapping[str, str] | None = None,
    ) -> None:
        self._seq += 1
        event = Event(self._seq, self._clock(), kind, message, device_uuid, lease_id, attrs or {})
        self._events.append(event)
        audit.info("event %d %s device=%s %s", event.seq, kind, device_uuid or "-", message)

    def since(self, seq: int = 0) -> list[Event]:
        return [e for e in self._events if e.seq > seq]

    @property
    def last_seq(self) -> int:
        return self._seq
