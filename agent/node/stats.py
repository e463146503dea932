"""Counting admission outcomes and decision latency for the metrics."""

from __future__ import annotations

from agent.core.snapshot import LATENCY_BUCKETS_S, AdmissionStats
from agent.core.types import Decision


class AdmissionRecorder:
    def __init__(self) -> None:
        self._outcomes: dict[tuple[str, str], int] = {}
        self._latency = [0] * len(LATENCY_BUCKETS_S)
        self._sum_s = 0.0
        self._count = 0

    def record(self, decision: Decision, took_s: float) -> None:
        reason = decision.reason.value if decision.reason else ""
        key = ("admitted", "") if decision.admitted else ("refused", reason)
        self._outcomes[key] = self._outcomes.get(key, 0) + 1
        for i, bound in enumerate(LATENCY_BUCKETS_S):
            if took_s <= bound:
                self._latency[i] += 1
        self._sum_s += took_s
        self._count += 1

    def snapshot(self) -> AdmissionStats:
        return AdmissionStats(dict(self._outcomes), tuple(self._latency), self._sum_s, self._count)
