"""How the controller is doing, as its probes tell it: the follow loop (list, then watch)
reports each step forward, and the probes read the record.

- Alive (``/healthz``): the process's event loop answers (the probe is served on it), and,
  while this replica works (it holds the Lease, or runs unelected), its follow loop made
  progress within ``stall_s``: a page of a list, a watch event or bookmark, a watch that
  ended at its timeout. A follow loop wedged while the Lease is still renewed (a hung
  call, a list that fails for good) fails it: the kubelet restarts the container and the
  other replica takes the Lease. ``stall_s`` must be above the watch's timeout (300 s): an
  idle watch may say nothing until then.
- Ready (``/readyz``): a standby (campaigning for the Lease) is ready, so that a rolling
  update, which waits for the new pod to be ready while the old one leads, goes on. The
  replica that works is ready once it has listed the claims in this term and while its
  last list or watch did not fail (and it is alive).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Progress:
    """The follow loop's record: its steps forward, its last failure, and whether it runs
    (this replica works). ``stall_s``: how long a working loop may go without a step."""

    def __init__(self, *, stall_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s = stall_s
        self._clock = clock
        self.following = False  # the follow loop runs: this replica leads (or is unelected)
        self.listed = False  # a whole list done in this term
        self.failure = ""  # the last list or watch that failed, "" after a step forward
        self.terms = 0
        self._step_at = clock()

    # -- what the follow loop reports ----------------------------------------------------------

    def began(self) -> None:
        """A term begins (the Lease won): nothing listed yet."""
        self.following, self.listed, self.failure = True, False, ""
        self.terms += 1
        self._step_at = self._clock()

    def ended(self) -> None:
        """The term ended (the Lease lost or released, or a stop)."""
        self.following, self.listed, self.failure = False, False, ""

    def stepped(self) -> None:
        """A step forward: a page of a list, a watch event, a watch ended at its timeout."""
        self._step_at = self._clock()
        self.failure = ""

    def listed_all(self) -> None:
        self.listed = True
        self.stepped()

    def failed(self, why: str) -> None:
        self.failure = why or "failed"

    # -- what the probes read -------------------------------------------------------------------

    @property
    def idle_s(self) -> float:
        """Seconds since the last step forward (or since the term began)."""
        return max(0.0, self._clock() - self._step_at)

    @property
    def role(self) -> str:
        return "leader" if self.following else "standby"

    def liveness_problems(self) -> list[str]:
        if self.following and self.idle_s >= self.stall_s:
            return [
                f"the follow loop made no progress (list or watch) for {self.idle_s:.0f} s "
                f"(stall limit {self.stall_s:.0f} s) while leading"
            ]
        return []

    def readiness_problems(self) -> list[str]:
        if not self.following:
            return []  # a standby is ready: a rollout goes on while the other leads
        problems = self.liveness_problems()
        if not self.listed:
            problems.append("the ResourceClaims are not listed yet in this term")
        if self.failure:
            problems.append(f"following the ResourceClaims fails: {self.failure}")
        return problems
