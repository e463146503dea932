"""The claims' CDI specs, kept twice: in the CDI directory the container runtime reads
(``/var/run/cdi``, which a reboot empties), and a record of each in the agent's state
directory, from which the agent writes them again at start.

After a reboot the kubelet's checkpoint still says the claims of the node's pods are
prepared, so it does not call Prepare again: a driver that does not write its specs again
leaves those pods failing for good when their containers are created again. So at start,
before the kubelet plugin serves, every kept spec whose claim still holds a live lease
(or that holds only ``adminAccess`` devices, which have no lease) is written again, and a
kept spec whose leases all ended is dropped with its CDI file.

A record is written before the CDI file and removed after it: a crash between the two
leaves a record, never a CDI file the agent has forgotten. Specs of the previous release
(a CDI file, no record) get a record at start when their claim holds live leases.

Only the ledger is synced to the disk at every change (its leases survive a power cut).
A record, its CDI file and the claim's index entry are renamed into place without an
fsync: a kill -9 keeps them (the kernel holds the writes), and what a power cut loses is
derived again from the ledger at start: a claim with live leases and no readable record
gets its record and spec rebuilt from its leases (:meth:`SpecKeeper.restore`'s
``leased``), and the reconcile finds a lost index entry's claim through its leases' pod
(:mod:`agent.claims.reconcile`). A record that holds ``adminAccess`` devices is the
exception: those have no lease to rebuild them from, so it is written durably.

Beside the records, in ``claims/``, the claims' names (:mod:`agent.claims.index`)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.claims.index import ClaimIndex
from agent.dra.cdi import remove_spec, spec_claims, spec_path, write_spec

log = logging.getLogger(__name__)

RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class KeptSpec:
    """A claim's spec as it was written, and the leases it was written for (none: only
    ``adminAccess`` devices)."""

    claim_uid: str
    lease_ids: tuple[str, ...]
    spec: Mapping[str, Any]
    admin: tuple[tuple[str, str], ...] = ()  # (share key, device UUID) of adminAccess results

    def record(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "claimUID": self.claim_uid,
            "leaseIDs": list(self.lease_ids),
            "admin": [{"key": k, "deviceUUID": u} for k, u in self.admin],
            "spec": dict(self.spec),
        }


@dataclass(slots=True)
class Restored:
    """What :meth:`SpecKeeper.restore` did, claim UIDs each."""

    written: list[str] = field(default_factory=list)  # a CDI file written again
    dropped: list[str] = field(default_factory=list)  # leases all ended: record and file gone
    adopted: list[str] = field(default_factory=list)  # a previous release's file, recorded
    unreadable: list[str] = field(default_factory=list)  # a record that cannot be read
    rebuilt: list[str] = field(default_factory=list)  # live leases, no record: from the ledger


Rebuild = Callable[[KeptSpec], Mapping[str, Any] | None]
LiveLeases = Callable[[str], Iterable[str]]  # claim UID -> ids of its live leases


def _as_kept(_kept: KeptSpec) -> None:
    return None


class SpecKeeper:
    """Writes, removes and restores the claims' specs. :meth:`write` of a spec without
    ``adminAccess`` devices and :meth:`remove` are a few syscalls with no fsync (cheaper
    on the event loop than a thread hop); the rest blocks: call it off the event loop."""

    def __init__(self, cdi_dir: str | os.PathLike[str], keep_dir: str | os.PathLike[str]) -> None:
        self.cdi_dir = Path(cdi_dir)
        self.keep_dir = Path(keep_dir)
        # the claims' names, beside their records (see agent.claims.index)
        self.index = ClaimIndex(self.keep_dir / "claims")

    def write(self, kept: KeptSpec) -> Path:
        """The record, then the CDI file; the record synced to the disk only when it
        holds ``adminAccess`` devices (nothing else could rebuild them)."""
        self.keep_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_spec(self.keep_dir, kept.claim_uid, kept.record(), durable=self.durable(kept))
        return write_spec(self.cdi_dir, kept.claim_uid, kept.spec)

    @staticmethod
    def durable(kept: KeptSpec) -> bool:
        """Whether writing ``kept`` syncs to the disk (blocking: off the event loop)."""
        return bool(kept.admin)

    def remove(self, claim_uid: str) -> bool:
        """Remove the claim's CDI file, then its record; False when there was no file."""
        removed = remove_spec(self.cdi_dir, claim_uid)
        remove_spec(self.keep_dir, claim_uid)
        return removed

    def claims(self) -> set[str]:
        """Claims with a spec: a CDI file or a record."""
        return spec_claims(self.cdi_dir) | spec_claims(self.keep_dir)

    def kept(self, claim_uid: str) -> KeptSpec | None:
        """The claim's record; None when it has none or it cannot be read."""
        try:
            raw = json.loads(spec_path(self.keep_dir, claim_uid).read_text(encoding="utf-8"))
            if raw.get("version") != RECORD_VERSION or raw.get("claimUID") != claim_uid:
                return None
            lease_ids = tuple(str(x) for x in raw["leaseIDs"])
            admin = tuple((str(a["key"]), str(a["deviceUUID"])) for a in raw.get("admin", ()))
            spec = raw["spec"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return KeptSpec(claim_uid, lease_ids, spec, admin) if isinstance(spec, dict) else None

    def restore(
        self,
        live: Callable[[str], Iterable[str]],
        rebuild: Rebuild = _as_kept,
        leased: Iterable[str] = (),
    ) -> Restored:
        """Write again every kept spec still in use; ``live(claim_uid)`` gives the ids of
        the claim's live leases, ``rebuild`` the spec as the agent writes it now (None:
        the kept copy as it was), ``leased`` the claims with live leases: one of them
        with no record (a power cut lost it) gets its spec rebuilt from its leases."""
        done = Restored()
        recorded = spec_claims(self.keep_dir)
        for uid in sorted(recorded):
            self._restore_one(uid, set(live(uid)), rebuild, done)
        for uid in sorted(spec_claims(self.cdi_dir) - recorded):
            self._adopt(uid, list(live(uid)), rebuild, done)
        for uid in sorted(set(leased) - recorded - set(done.adopted)):
            self._from_leases(uid, list(live(uid)), rebuild, done)
        return done

    def _from_leases(self, uid: str, live_ids: list[str], rebuild: Rebuild, done: Restored) -> bool:
        """The claim's record and spec built again from its live leases; False when it
        has none or they cannot be built."""
        spec = rebuild(KeptSpec(uid, tuple(live_ids), {})) if live_ids else None
        if not spec:
            return False
        self.write(KeptSpec(uid, tuple(sorted(live_ids)), spec))
        done.rebuilt.append(uid)
        return True

    def _restore_one(self, uid: str, live_ids: set[str], rebuild: Rebuild, done: Restored) -> None:
        kept = self.kept(uid)
        if kept is None:
            if self._from_leases(uid, sorted(live_ids), rebuild, done):
                return
            log.warning("the kept CDI spec of claim %s cannot be read; left as it is", uid)
            done.unreadable.append(uid)
            return
        if kept.lease_ids and not live_ids.intersection(kept.lease_ids):
            self.remove(uid)
            done.dropped.append(uid)
            return
        spec = rebuild(kept) or kept.spec
        if spec != kept.spec:
            kept = KeptSpec(uid, tuple(sorted(live_ids)), spec, kept.admin)
            write_spec(self.keep_dir, uid, kept.record(), durable=True)
        if self._on_disk(uid) != spec:
            write_spec(self.cdi_dir, uid, spec)
            done.written.append(uid)

    def _adopt(self, uid: str, live_ids: list[str], rebuild: Rebuild, done: Restored) -> None:
        """A spec of the last release (no record): recorded, in today's layout."""
        spec = self._on_disk(uid)
        if spec is None or not live_ids:
            return  # not this agent's to keep: the reconcile decides on it
        kept = KeptSpec(uid, tuple(live_ids), spec)
        kept = KeptSpec(uid, kept.lease_ids, rebuild(kept) or spec)
        self.write(kept)
        done.adopted.append(uid)

    def _on_disk(self, uid: str) -> dict[str, Any] | None:
        try:
            found = json.loads(spec_path(self.cdi_dir, uid).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None
