"""Processes to leases, for readiness and the janitor (one attributor per node, shared).

Each PID's identity comes from /proc (:mod:`agent.control.processes`, cached per PID and
start time); the decision is the pure :func:`agent.core.identity.attribute`. A process whose
``GPUSHARE_LEASE_ID`` names a lease its cgroup contradicts is a security event,
``lease.identity_mismatch``, once per (PID, start time): a WARNING log line and a count in
``gpushare_lease_identity_mismatches_total``. Nothing is done to the lease it named.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from agent.control.processes import IdentityCache
from agent.core.identity import NO_LEASE, Attribution, ProcessIdentity, attribute
from agent.core.lease import Lease
from agent.node.events import EventLog

log = logging.getLogger(__name__)
MISMATCH_EVENT = "lease.identity_mismatch"


class ProcessAttributor:
    def __init__(self, events: EventLog, *, cache: IdentityCache | None = None) -> None:
        self._events = events
        self._cache = cache or IdentityCache()
        self._reported: set[tuple[int, int]] = set()  # (PID, start time)
        self.mismatches_total = 0
        # lease id -> the workload it is bound to now, for leases whose stored one says
        # less (a shared claim's lease: the pods the claim is reserved for, as last read)
        self.bound_now: Callable[[], Mapping[str, str]] = dict

    async def attribute(
        self, pids: Iterable[int], leases: Iterable[Lease]
    ) -> dict[int, Attribution]:
        """The lease each PID belongs to (``NO_LEASE`` for one gone or unreadable)."""
        wanted = set(pids)
        identities = await asyncio.to_thread(self._cache.lookup, wanted)
        workloads = {x.lease_id: x.workload for x in leases}
        workloads |= {k: v for k, v in self.bound_now().items() if k in workloads}
        found = {pid: NO_LEASE for pid in wanted}
        for pid, identity in identities.items():
            found[pid] = attribute(identity, workloads)
            if found[pid].mismatch is not None:
                self._report(identity, found[pid])
        self._reported &= self._cache.cached()
        return found

    async def owners(self, pids: Iterable[int], leases: Iterable[Lease]) -> dict[int, str | None]:
        """The lease id each PID belongs to, if any."""
        return {pid: a.lease_id for pid, a in (await self.attribute(pids, leases)).items()}

    def _report(self, identity: ProcessIdentity, attribution: Attribution) -> None:
        key = (identity.pid, identity.start_time_ticks)
        if key in self._reported:
            return
        self._reported.add(key)
        self.mismatches_total += 1
        message = attribution.mismatch or ""
        log.warning("SECURITY: lease identity mismatch: %s", message)
        cgroup = identity.cgroup
        self._events(
            MISMATCH_EVENT,
            message,
            lease_id=identity.hint or cgroup.lease_id,
            attrs={
                "pid": str(identity.pid),
                "start_time_ticks": str(identity.start_time_ticks),
                "hinted_lease_id": identity.hint or cgroup.lease_id or "",
                "cgroup": cgroup.describe(),
                "attributed_lease_id": attribution.lease_id or "",
            },
        )
