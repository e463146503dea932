"""Leader election, on the floor both Kubernetes paths share: the parts that write run in
one replica at a time, the holder of one ``coordination.k8s.io/v1`` Lease (the protocol of
client-go's ``leaderelection``, which kube-scheduler uses for its own Lease). On the
extender path the lease controller and the node-state publisher of ``kube serve`` (the
extender, the webhook and the agents' cache run in every replica); on the DRA path the
binding-answer controller of ``dra controller``.

- A candidate reads the Lease every ``retry_period_s``. It takes a Lease that does not
  exist, that has no holder (released), or whose record has not changed for the holder's
  ``leaseDurationSeconds`` as this process has watched it (its own clock: no comparison of
  two machines' clocks). Every write names the resourceVersion it read, so of two
  candidates one wins and the other gets 409.
- The leader renews every ``retry_period_s``. When no renewal has succeeded for
  ``renew_deadline_s`` (counted from when the last good one was sent), or the Lease shows
  another holder, it cancels its work at once: the others wait ``lease_duration_s`` from
  when they saw its last renewal, which is later than that. A write already sent may
  still land after that (an API request may outlive the Lease), so what the work writes
  must not rely on the Lease alone: the DRA controller's status writes carry the
  resourceVersion they read, so a stale leader's write gets 409 or lands once.
- On a clean stop the leader releases the Lease (no holder), so another replica takes
  over at its next read instead of after the duration.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import secrets
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from agent.kubeapi.port import Conflict, KubeApi, KubeError, NotFound, Obj

log = logging.getLogger(__name__)

Verdict = Literal["create", "renew", "take", "wait"]


@dataclass(frozen=True, slots=True)
class LeaderOptions:
    namespace: str = "gpushare-system"
    name: str = "gpushare-kube-serve"
    identity: str = ""  # "": the pod's name (HOSTNAME) and a random suffix
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration"
            )


@dataclass(frozen=True, slots=True)
class Record:
    """What the Lease says, as far as deciding goes."""

    holder: str
    duration_s: float
    transitions: int
    version: str  # its resourceVersion


def record_of(lease: Obj) -> Record:
    spec = lease.get("spec") or {}
    return Record(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=float(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


def verdict(record: Record | None, me: str, *, unchanged_for_s: float) -> Verdict:
    """What a candidate does on reading ``record`` (None: no Lease), which it has seen
    unchanged for ``unchanged_for_s`` seconds of its own clock."""
    if record is None:
        return "create"
    if record.holder == me:
        return "renew"
    if not record.holder or unchanged_for_s >= record.duration_s:
        return "take"
    return "wait"


def default_identity() -> str:
    """Unique per process, readable per pod: a restarted container is a new candidate."""
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{secrets.token_hex(4)}"


def written_duration_s(lease_duration_s: float) -> int:
    """The Lease's ``leaseDurationSeconds`` (whole seconds, at least 1): rounded up, so
    the others never wait less than this process counts on."""
    return max(1, math.ceil(lease_duration_s))


def micro_time(at_s: float) -> str:
    """Kubernetes' MicroTime: RFC 3339 with microseconds, in UTC."""
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        options: LeaderOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self.options = options
        self.identity = options.identity or default_identity()
        self._clock = clock
        self._wall = wall
        self._seen: tuple[str, float] | None = None  # (resourceVersion, first seen at)
        self._acquired_at = ""  # the acquireTime of this term
        self.leading = False

    async def try_once(self) -> bool:
        """One read and, where the verdict allows, one write; True when this process
        holds the Lease now."""
        options = self.options
        try:
            lease: Obj | None = await self._api.get_lease(options.namespace, options.name)
        except NotFound:
            lease = None
        record = record_of(lease) if lease is not None else None
        now = self._clock()
        if record is not None and (self._seen is None or self._seen[0] != record.version):
            self._seen = (record.version, now)
        unchanged_s = now - self._seen[1] if record is not None and self._seen else 0.0
        decided = verdict(record, self.identity, unchanged_for_s=unchanged_s)
        if decided == "wait":
            return False
        try:
            if lease is None or record is None:
                await self._api.create_lease(options.namespace, self._written({}, None))
            else:  # the object read, its resourceVersion the condition of the write
                await self._api.replace_lease(
                    options.namespace, options.name, self._written(lease, record)
                )
        except Conflict:  # another candidate wrote first (or the Lease was just created)
            return False
        return True

    def _written(self, lease: Obj, record: Record | None) -> Obj:
        """``lease`` (as read: its labels and the rest kept) held by this process now."""
        now = micro_time(self._wall())
        taking = record is None or record.holder != self.identity
        if taking or not self._acquired_at:
            self._acquired_at = now
        transitions = record.transitions if record is not None else 0
        if record is not None and taking:
            transitions += 1  # the holder changes (from none too), as client-go counts
        metadata = {
            **(lease.get("metadata") or {}),
            "name": self.options.name,
            "namespace": self.options.namespace,
        }
        spec = {
            **(lease.get("spec") or {}),
            "holderIdentity": self.identity,
            "leaseDurationSeconds": written_duration_s(self.options.lease_duration_s),
            "acquireTime": self._acquired_at,
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        return {
            **lease,
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    async def run(self, work: Callable[[], Coroutine[object, object, None]]) -> None:
        """For ever: win the Lease, run ``work`` while holding it, stop it when the Lease
        is lost, and campaign again. A stop (cancellation) or a failure (of ``work`` or of
        the renewals: raised here) stops the work first, then releases the Lease."""
        while True:
            renewed_at = await self._acquire()
            self.leading = True
            log.info("leader election: %s leads (Lease %s/%s)", self.identity, *self._where())
            doing = asyncio.create_task(work(), name="leader-work")
            keeping = asyncio.create_task(self._keep(renewed_at), name="leader-renew")
            lost = False
            failed: BaseException | None = None
            try:
                await asyncio.wait({doing, keeping}, return_when=asyncio.FIRST_COMPLETED)
                ended = doing if doing.done() else keeping
                if ended.cancelled():  # not by us: as a failure
                    failed = RuntimeError(f"{ended.get_name()} was cancelled")
                else:
                    failed = ended.exception()
                lost = ended is keeping and failed is None
            finally:
                self.leading = False
                for task in (doing, keeping):
                    task.cancel()
                await asyncio.gather(doing, keeping, return_exceptions=True)
                if not lost:
                    await self._release()
            if failed is not None:
                raise failed
            if not lost:
                raise RuntimeError("the leader's work ended")
            log.warning("leader election: %s lost the Lease; its work stopped", self.identity)
            await asyncio.sleep(self.options.retry_period_s)  # no churn on a slow API

    def _where(self) -> tuple[str, str]:
        return self.options.namespace, self.options.name

    async def _acquire(self) -> float:
        """Campaign until this process holds the Lease; when the winning write was sent
        (the term counts from then). Each new reason a try failed is logged once."""
        options, said = self.options, ""
        while True:
            sent_at = self._clock()
            try:
                async with asyncio.timeout(options.renew_deadline_s):
                    if await self.try_once():
                        return sent_at
            except (KubeError, TimeoutError) as exc:
                why = str(exc) or type(exc).__name__
                if why != said:
                    log.warning(
                        "leader election: cannot take the Lease %s/%s: %s", *self._where(), why
                    )
                    said = why
            # jittered, as client-go's: candidates that started together spread out
            await asyncio.sleep(options.retry_period_s * random.uniform(1.0, 1.2))

    async def _keep(self, renewed_at: float) -> None:
        """Renew until a renewal shows another holder, or none succeeded within the
        deadline of the last good one (counted from when it was sent)."""
        options = self.options
        while True:
            left_s = renewed_at + options.renew_deadline_s - self._clock()
            await asyncio.sleep(min(options.retry_period_s, max(left_s, 0.0)))
            sent_at = self._clock()
            left_s = renewed_at + options.renew_deadline_s - sent_at
            if left_s <= 0:
                log.warning("leader election: no renewal for %.1f s", options.renew_deadline_s)
                return
            try:
                async with asyncio.timeout(left_s):
                    held = await self.try_once()
            except (KubeError, TimeoutError) as exc:
                log.warning("leader election: renewal failed: %s", str(exc) or repr(exc))
                continue
            if not held:
                return
            renewed_at = sent_at

    async def _release(self) -> None:
        """Leave the Lease without a holder (best effort, briefly): the next candidate
        takes it at its next read."""
        try:
            async with asyncio.timeout(self.options.renew_deadline_s):
                lease = await self._api.get_lease(*self._where())
                if record_of(lease).holder != self.identity:
                    return
                spec = dict(lease.get("spec") or {})
                spec.update(
                    holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(self._wall())
                )
                await self._api.replace_lease(*self._where(), {**lease, "spec": spec})
            log.info("leader election: %s released the Lease", self.identity)
        except (KubeError, TimeoutError) as exc:
            log.warning("leader election: the Lease was not released: %s", str(exc) or repr(exc))
