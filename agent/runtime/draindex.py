"""The node's claim index: claim UID -> (namespace, name), one small file per claim in the
state directory, beside the claims' kept specs (``<state_dir>/cdi/claims/<uid>.json``).

The kubelet names a claim by namespace, name and UID; the ledger knows a claim only by
its UID (in its leases' request ids). The claim reconcile reads each claim of the node by
name, one GET each, so the name must outlive the agent: it is written, fsynced and renamed
into place (then the directory fsynced) *before* the claim's first lease is admitted (at
Prepare, and at the binding answer), so a lease never exists whose claim's name the node
has lost, whatever crash comes between. It is removed once the claim holds neither a live
lease nor a spec (Unprepare, the reconcile's release, or the reconcile's sweep of entries
left by a Prepare or an answer that admitted nothing): the index is bounded by the node's
claims.

It sits beside the kept specs because it has their lifetime and their home: what the
agent keeps per claim across restarts and reboots, under the state directory (not in
``/var/run/cdi``, which a reboot empties), with no setting of its own. A record of the
spec could not hold it: the spec is written after the admissions.

Leases of the previous release have no entry: the reconcile finds their claims' names
otherwise (:mod:`agent.runtime.drareconcile`) and writes them here.
Blocking: call off the event loop (:meth:`ClaimIndex.remember` of a name already known is
a dictionary lookup)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

VERSION = 1
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a file name, never a path
SUFFIX = ".json"


@dataclass(frozen=True, slots=True)
class ClaimName:
    namespace: str
    name: str
    at: float = 0.0  # when the entry was written (wall clock, seconds)


class ClaimIndex:
    """Claim UID -> its namespace and name, durable. Blocking: call off the event loop."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._known: dict[str, tuple[str, str]] = {}  # written by this process, unchanged

    def path(self, uid: str) -> Path:
        if not _UID.fullmatch(uid):
            raise ValueError(f"not a claim UID: {uid[:64]!r}")
        return self.directory / f"{uid}{SUFFIX}"

    def remember(self, uid: str, namespace: str, name: str) -> bool:
        """Write the claim's entry durably (a no-op when this process wrote the same);
        True when it wrote. Raises OSError (and ValueError for a UID that is no file
        name): the lease must then not be admitted."""
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
            json.dump(record, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        self._sync_directory()
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
                if p.name.endswith(SUFFIX) and _UID.fullmatch(p.name[: -len(SUFFIX)])
            }
        return set()

    def entries(self) -> dict[str, ClaimName | None]:
        """Every entry, None for one that cannot be read."""
        return {uid: self.get(uid) for uid in sorted(self.uids())}

    def _sync_directory(self) -> None:
        """The rename made durable (a crash after it keeps the entry)."""
        try:
            fd = os.open(self.directory, os.O_RDONLY)
        except OSError as exc:  # pragma: no cover - a platform without directory fds
            log.debug("claim index directory not synced: %s", exc)
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
