"""Binding answers (KEP-5007) for the whole cluster: the scheduler waits, before it binds a
pod, until each device allocated to the pod's claims says it is usable. This controller
follows the ResourceClaims once for the cluster (list, then watch from the list's
resourceVersion), and for each claim whose results of driver ``gpushare.io`` wait for a
binding condition it asks the agent of the node of those results (pool = node) to decide,
and writes the agent's word (``gpushare.io/admitted`` or ``gpushare.io/refused`` with the
agent's reason) into the claim's ``status.devices``. The agent keeps the decision (its
retention gate, trust domain, client cap, priorities) and the lease it admits; asked again
about the same claim it answers the same (its request ids are the claim's UID and share).

An answer not written is owed (:class:`agent.aio.owed.Owed`, one task per claim): tried
again with a backoff doubling from ``backoff_s`` to ``backoff_max_s``, the claim read again
before each retry, until it is written (or found written: a write that landed with its
reply lost is not written twice), or the claim is gone (deleted, replaced by another of its
name) or no longer waits (deallocated: the scheduler's binding timeout). An agent that
cannot be reached keeps the claim owed: the controller never refuses a share on its own.
Every status write carries the resourceVersion read, so a write over a newer claim (the
scheduler's, another controller's) is a 409 and the claim is read again.

Cost: the list and the watch carry every claim of the cluster, but only changes whose JSON
mentions the driver (``"gpushare.io"``: its device class, its results) are decoded; the
others pass as bookmarks. The list comes in pages (``page_size`` claims each, following
``metadata.continue``; all pages one snapshot of the first page's resourceVersion, which
the watch starts from), each page's claims considered as it comes; a continue token that
expired between pages (410) lists again from the first page. One task per claim owed,
none for answered ones; a relist (at start, on 410 Gone) wakes a claim's task rather than
starting another, and a watch that ends at its timeout, or fails, resumes from its
resourceVersion without a relist. A list or watch that fails is tried again after a
backoff doubling from ``backoff_s`` to ``backoff_max_s``.

Slots: ``concurrency`` API calls at once (the re-reads and status writes), and
``per_node_concurrency`` asks at once to one node's agent (:mod:`agent.dracontrol.slots`):
a slow or hung agent (each ask may take the call's timeout, twice) holds its own node's
slots only, so the other nodes' claims are answered meanwhile. The follow loop's steps are
recorded (:class:`agent.dracontrol.health.Progress`) for the probes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.aio.owed import Debt, Outcome, Owed, doubling
from agent.dra.claims import REFUSED, Share, metadata, with_device_status
from agent.dracontrol.answers import (
    DRIVER,
    answer_condition,
    now_rfc3339,
    raw_pending,
    waiting_pools,
)
from agent.dracontrol.health import Progress
from agent.dracontrol.port import ClaimsApi, Decider, ShareAnswerValue, Unreached
from agent.dracontrol.slots import NodeSlots
from agent.kubeapi.port import Conflict, Gone, KubeError, NotFound, Obj

log = logging.getLogger(__name__)

__all__ = ["DRIVER", "BindingController", "Counters", "answer_condition", "waiting_pools"]

FRESH_LISTS = 3  # lists begun again at once when a continue token expires, before a backoff


@dataclass
class Counters:
    """What the controller has done since it started (for the bench, the logs, /metrics)."""

    claims_seen: int = 0  # claim objects decoded (listed, or in a watch event)
    events_skipped: int = 0  # watch events passed undecoded (claims not of the driver)
    bytes_decoded: int = 0  # their JSON's size, when measured (``measure_bytes``)
    relists: int = 0  # lists begun from the first page
    list_pages: int = 0
    follow_failures: int = 0  # lists and watches that failed (then backed off)
    asks: int = 0  # AnswerClaim calls to the agents
    unreached: int = 0  # of which gave no answer
    answers_written: int = 0  # shares whose answer landed in a status write
    refusals_written: int = 0  # of which refused
    write_failures: int = 0  # status writes that failed (other than 409 and 404)


class BindingController:
    """Run :meth:`run` in the leader only (:class:`agent.kubeapi.leader.LeaderElector`):
    cancelled, it stops every owed try at once. ``concurrency`` bounds its API reads and
    status writes at once; ``per_node_concurrency`` its asks at once to one node's agent
    (a claim waiting for a busy node's agent holds no API slot meanwhile)."""

    def __init__(
        self,
        api: ClaimsApi,
        decider: Decider,
        *,
        driver: str = DRIVER,
        concurrency: int = 32,
        per_node_concurrency: int = 4,
        page_size: int = 500,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        watch_timeout_s: float = 300.0,
        measure_bytes: bool = False,
        progress: Progress | None = None,
    ) -> None:
        self._api = api
        self._decider = decider
        self.driver = driver
        self._slots = asyncio.Semaphore(concurrency)
        self.node_slots = NodeSlots(per_node_concurrency)
        self._page_size = page_size
        self._backoff_s, self._backoff_max_s = backoff_s, backoff_max_s
        self._delays_s = doubling(backoff_s, backoff_max_s)
        self._failing = False  # the last list or watch failed: backing off
        self._watch_timeout_s = watch_timeout_s
        self._measure = measure_bytes
        self._mentioning = json.dumps(driver)
        self._owed: Owed[Obj] = Owed(
            self._attempt, first_s=backoff_s, max_s=backoff_max_s, name=_task_name
        )
        self.progress = progress or Progress(stall_s=max(3 * watch_timeout_s, 60.0))
        self.counters = Counters()

    @property
    def owing(self) -> int:
        """Claims whose answer is owed now."""
        return len(self._owed)

    async def run(self) -> None:
        """Follow the claims until cancelled: list (in pages), then watch from the list's
        resourceVersion; a watch that ends resumes from where it was, a 410 Gone lists
        again. A list or watch that fails is tried again after a backoff doubling from
        ``backoff_s`` to ``backoff_max_s`` (a watch from where it was: no relist)."""
        self.progress.began()
        version = ""  # "": list (again) before watching
        try:
            while True:
                try:
                    version = version or await self._relisted()
                    version = await self._watched(version)
                except (KubeError, OSError) as exc:
                    await self._backed_off(exc)
        finally:
            self.progress.ended()
            await self._owed.aclose()

    async def _backed_off(self, exc: BaseException) -> None:
        delay_s = next(self._delays_s)
        self._failing = True
        self.counters.follow_failures += 1
        self.progress.failed(str(exc))
        log.warning("following ResourceClaims failed (%s); again in %.1fs", exc, delay_s)
        await asyncio.sleep(delay_s)

    def _stepped(self) -> None:
        """A step forward: the next failure backs off from the start."""
        if self._failing:
            self._failing = False
            self._delays_s = doubling(self._backoff_s, self._backoff_max_s)
        self.progress.stepped()

    async def _relisted(self) -> str:
        """Every claim listed (and considered), page by page; the list's resourceVersion.
        A continue token that expired between pages (410) lists again from the first page
        at once, :data:`FRESH_LISTS` times at most in a row."""
        for _ in range(FRESH_LISTS - 1):
            try:
                return await self._listed()
            except Gone as exc:
                log.info("the claims' list expired between its pages (%s); listed again", exc)
        return await self._listed()

    async def _listed(self) -> str:
        self.counters.relists += 1
        version, token = "", ""
        while True:
            page = await self._api.list_resource_claims(limit=self._page_size, continue_token=token)
            self.counters.list_pages += 1
            self._stepped()
            version = version or page.resource_version  # every page has the first one's
            for claim in page.items:
                self._seen(claim)
                self._consider(claim)
            token = page.continue_token
            if not token:
                self.progress.listed_all()
                return version

    async def _watched(self, version: str) -> str:
        """Watch from ``version`` until the server ends the watch; the version to watch
        from next, or "" to list again (410 Gone: too old)."""
        try:
            async for event in self._api.watch_resource_claims(
                version, timeout_s=self._watch_timeout_s, mentioning=self._mentioning
            ):
                self._stepped()
                version = str(metadata(event.obj).get("resourceVersion") or version)
                if event.kind == "BOOKMARK":
                    self.counters.events_skipped += "kind" not in event.obj
                    continue
                self._seen(event.obj)
                if event.kind == "DELETED":
                    self._owed.nudge(_uid(event.obj))
                else:
                    self._consider(event.obj)
        except Gone:
            return ""
        self._stepped()  # ended at its timeout
        return version

    def _seen(self, claim: Obj) -> None:
        self.counters.claims_seen += 1
        if self._measure:
            self.counters.bytes_decoded += len(json.dumps(claim, separators=(",", ":")))

    def _consider(self, claim: Obj) -> None:
        """Owe the claim its answer if it waits for one; wake its owed try if any."""
        uid = _uid(claim)
        if uid in self._owed or waiting_pools(claim, self.driver):
            self._owed.owe(uid, claim)

    async def _attempt(self, debt: Debt[Obj]) -> bool:
        """One try: on the watch's copy first (the newest seen), after that on the claim
        read again; a copy found stale is read again at once, once. True once nothing is
        owed."""
        reread = debt.tries > 0
        for _ in range(2):
            outcome = await self._try(debt.item, reread=reread)
            if outcome is not Outcome.STALE:
                return outcome is Outcome.SETTLED
            reread = True
        return False

    async def _try(self, copy: Obj, *, reread: bool) -> Outcome:
        """Read (when ``reread``), ask each node's agent, write: the read and the write each
        under one of the API slots, each ask under one of its node's slots only."""
        try:
            claim = await self._reread(copy) if reread else copy
        except KubeError as exc:
            log.warning("claim %s not read again (%s); tried again", _key(copy), exc)
            return Outcome.FAILED
        if not claim:
            return Outcome.SETTLED  # gone: nothing to answer
        pools = waiting_pools(claim, self.driver)
        if not pools:
            # answered (maybe by a write whose reply was lost), or not waiting
            return Outcome.SETTLED
        asked = await asyncio.gather(*(self._ask(pool, claim) for pool in pools))
        answers = {pool: found for pool, found in zip(pools, asked, strict=True) if found}
        complete = all(asked)
        if answers:
            outcome = await self._written(claim, answers)
            if outcome is not Outcome.SETTLED:
                return outcome
        return Outcome.SETTLED if complete else Outcome.FAILED

    async def _ask(self, node: str, claim: Obj) -> list[tuple[Share, Obj]]:
        """The agent of ``node``'s answers for its waiting shares, as entries to write; []
        when it gave none (not reached, or none of its answers matches a waiting share:
        the claim stays owed)."""
        try:
            async with self.node_slots.held(node):
                self.counters.asks += 1
                said = await self._decider.answer(node, claim)
        except Unreached as exc:
            self.counters.unreached += 1
            log.warning("binding answer for claim %s on %s not had: %s", _key(claim), node, exc)
            return []
        waiting = raw_pending(claim, self.driver, node)
        at = now_rfc3339()
        entries = [
            (_share(a), answer_condition(a, at)) for a in said if (a.device, a.share_id) in waiting
        ]
        if len(entries) != len(said) or not entries:
            log.warning(
                "the agent of %s answered %d share(s) of claim %s, %d of them waiting",
                node,
                len(said),
                _key(claim),
                len(entries),
            )
        return entries

    async def _written(
        self, claim: Obj, answers: Mapping[str, Sequence[tuple[Share, Obj]]]
    ) -> Outcome:
        body: Obj = claim
        for pool, entries in answers.items():
            body = with_device_status(body, self.driver, pool, entries)
        meta = metadata(claim)
        try:
            async with self._slots:
                await self._api.replace_resource_claim_status(
                    str(meta.get("namespace") or ""), str(meta.get("name") or ""), body
                )
        except (Conflict, NotFound):
            return Outcome.STALE  # changed or gone meanwhile: the answer may have landed
        except KubeError as exc:
            self.counters.write_failures += 1
            refused = 400 <= exc.status < 500 and exc.status != 429  # RBAC, validation
            log.log(
                logging.ERROR if refused else logging.WARNING,
                "binding answer for claim %s not written (%s); tried again",
                _key(claim),
                exc,
            )
            return Outcome.FAILED
        written = [c for entries in answers.values() for _, c in entries]
        self.counters.answers_written += len(written)
        self.counters.refusals_written += sum(1 for c in written if c["type"] == REFUSED)
        return Outcome.SETTLED

    async def _reread(self, claim: Obj) -> Obj:
        """The claim as the API has it now; {} when it is gone or replaced."""
        meta = metadata(claim)
        try:
            async with self._slots:
                fresh = await self._api.get_resource_claim(
                    str(meta.get("namespace") or ""), str(meta.get("name") or "")
                )
        except NotFound:
            return {}
        return fresh if metadata(fresh).get("uid") == meta.get("uid") else {}


def _share(answer: ShareAnswerValue) -> Share:
    """The entry's key (device, share id) as :func:`with_device_status` takes it."""
    return Share("", answer.device, answer.share_id, None, None)


def _key(claim: Mapping[str, Any]) -> str:
    meta = metadata(claim)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _uid(claim: Mapping[str, Any]) -> str:
    return str(metadata(claim).get("uid") or "")


def _task_name(claim: Mapping[str, Any]) -> str:
    return f"answer-{_key(claim)}"
