"""Refused admissions, told: each refusal of a request becomes a ``lease.refused`` event
(its request id, tenant, pod, reason and sentence), so that "why was job X refused at
02:00" has an answer afterwards. Bounded: the same request refused again within
``repeat_s`` (a scheduler retrying) is told once, and at most ``per_s`` refusals a second
are told at all (the rest are counted, as every decision is, in the admission metrics)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from agent.core.types import AdmissionRequest, Decision
from agent.node.events import EventLog

KEPT = 4096  # requests remembered for repeats


class RefusalNotes:
    def __init__(
        self,
        events: EventLog,
        *,
        clock: Callable[[], float],
        repeat_s: float = 60.0,
        per_s: int = 20,
    ) -> None:
        self._events = events
        self._clock = clock
        self._repeat_s = repeat_s
        self._per_s = per_s
        self._told: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._second = (0, 0)  # (the second, refusals told in it)
        self.dropped = 0

    def __call__(self, request: AdmissionRequest, decision: Decision) -> bool:
        """Tell this refusal unless it is a repeat or over the rate; whether it was told."""
        now = self._clock()
        key = (request.tenant, request.request_id)
        if now - self._told.get(key, -self._repeat_s) < self._repeat_s or not self._room(now):
            self.dropped += 1
            return False
        self._told[key] = now
        self._told.move_to_end(key)
        while len(self._told) > KEPT:
            self._told.popitem(last=False)
        reason = decision.reason.value if decision.reason else "REFUSED"
        attrs = {"request_id": request.request_id, "tenant": request.tenant, "reason": reason}
        if request.pod:
            attrs["pod"] = request.pod
        self._events(
            "lease.refused",
            f"request {request.request_id} of {request.tenant} refused: {reason}: "
            f"{decision.message}",
            device_uuid=request.device_uuid,
            attrs=attrs,
        )
        return True

    def _room(self, now: float) -> bool:
        second, told = self._second
        if int(now) != second:
            second, told = int(now), 0
        if told >= self._per_s:
            return False
        self._second = (second, told + 1)
        return True
