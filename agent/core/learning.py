"""What the agent learns from: the leases that ended (the readiness predictor's rows), the
progress its leases report, and each retrain of the retention model on the node's records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """A lease that ended, for the readiness predictor: the nine attributes known when it
    was admitted, how it ended, and whether (and how soon) a client of it appeared."""

    lease_id: str
    ended_at: float
    final_state: str
    attributes: Mapping[str, float | str]
    became_ready: bool
    ready_after_s: float | None


@dataclass(frozen=True, slots=True)
class ProgressAnswer:
    """What the agent measured of a lease's progress so far (ReportProgress's answer)."""

    lease_id: str
    window_s: float = 0.0  # the span of its reports in its current window
    rate_per_s: float = 0.0  # units a second over that span; 0 while it is too short
    peers: int = 0  # the other leases on its device in the current window
    records: int = 0  # run records made from its windows so far


@dataclass(frozen=True, slots=True)
class RetrainAnswer:
    """One attempt to retrain the retention model on the node's run records."""

    swapped: bool
    reason: str
    node_records: int
    figures: Mapping[str, float] = field(default_factory=dict)
    model_dir: str = ""  # the model swapped in; "" when kept
