"""The node's claim index: claim UID -> (namespace, name), one small file per claim in the
state directory, beside the claims' kept specs (``<state_dir>/cdi/claims/<uid>.json``).

The kubelet names a claim by namespace, name and UID; the ledger knows a claim only by
its UID (in its leases' request ids). The claim reconcile reads each claim of the node by
name, one GET each, so the name must outlive the agent: it is renamed into place *before*
the claim's first lease is admitted (at Prepare, and at the binding answer), so a lease
never exists whose claim's name a kill -9 of the agent has lost. It is not synced to the
disk (only the ledger is, at every change): an entry a power cut loses is found again by
the reconcile through its leases' pod, as for a lease of the previous release. It is
removed once the claim holds neither a live lease nor a spec (Unprepare, the reconcile's
release, or the reconcile's sweep of entries left by a Prepare or an answer that admitted
nothing): the index is bounded by the node's claims.

It sits beside the kept specs because it has their lifetime and their home: what the
agent keeps per claim across restarts and reboots, under the state directory (not in
``/var/run/cdi``, which a reboot empties), with no setting of its own. A record of the
spec could not hold it: the spec is written after the admissions.

Leases of the previous release have no entry: the reconcile finds their claims' names
otherwise (:mod:`agent.claims.reconcile`) and writes them here.
:meth:`ClaimIndex.remember` is a small write and a rename (a name already known, a
dictionary lookup) and :meth:`ClaimIndex.forget` an unlink: cheaper on the event loop
than a thread hop."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from agent.core.k8snames import UID

log = logging.getLogger(__name__)

VERSION = 1
SUFFIX = ".json"


@dataclass(frozen=True, slots=True)
class ClaimName:
    namespace: str
    name: str
    at: float = 0.0  # when the entry was written (wall clock, seconds)


class ClaimIndex:
    """Claim UID -> its namespace and name, kept across restarts of the agent."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._known: dict[str, tuple[str, str]] = {}  # written by this process, unchanged

    def path(self, uid: str) -> Path:
        if not UID.holds(uid):  # a file name, never a path
            raise ValueError(f"not a claim UID: {uid[:64]!r}")
        return self.directory / f"{uid}{SUFFIX}"

    def remember(self, uid: str, namespace: str, name: str) -> bool:
        """Write the claim's entry (a no-op when this process wrote the same); True when
        it wrote. Raises OSError (and ValueError for a UID that is no file name): the
        lease must then not be admitted."""
        if self._known.get(uid) == (namespace, name):
            return False
        path = self.path(uid)
        record = {
            "version": VERSION,
            "claimUID": uid,
            "namespace": namespace,
            "name": name,
            "at": time.time(),
        }
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        with open(temporary, "w", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True))
        os.replace(temporary, path)
        self._known[uid] = (namespace, name)
        return True

    def forget(self, uid: str) -> bool:
        """Remove the claim's entry; False when it had none."""
        self._known.pop(uid, None)
        try:
            self.path(uid).unlink()
        except (FileNotFoundError, ValueError):
            return False
        return True

    def get(self, uid: str) -> ClaimName | None:
        """The claim's entry; None when it has none or it cannot be read."""
        try:
            raw = json.loads(self.path(uid).read_text(encoding="utf-8"))
            if raw.get("version") != VERSION or raw.get("claimUID") != uid:
                return None
            namespace, name, at = raw["namespace"], raw["name"], float(raw.get("at") or 0.0)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if not isinstance(namespace, str) or not isinstance(name, str) or not name:
            return None
        return ClaimName(namespace, name, at)

    def uids(self) -> set[str]:
        """The claims with an entry (readable or not)."""
        with contextlib.suppress(FileNotFoundError):
            return {
                p.name[: -len(SUFFIX)]
                for p in self.directory.iterdir()
                if p.name.endswith(SUFFIX) and UID.holds(p.name[: -len(SUFFIX)])
            }
        return set()

    def entries(self) -> dict[str, ClaimName | None]:
        """Every entry, None for one that cannot be read."""
        return {uid: self.get(uid) for uid in sorted(self.uids())}
