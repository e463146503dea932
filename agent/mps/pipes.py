"""Who may reach a device's MPS pipe and log directories, and a watch on their modes.

Anyone who can connect to the control daemon's ``control`` socket can change its defaults,
and ``nvidia-cuda-mps-control`` itself makes ``control``, ``control_lock`` and ``log``
world-writable (0666/0777) whatever the umask: the pipe *directory* is the boundary. So the
directories belong to the agent's user and one client group (0750), or to the agent's user
alone (0700) when that group does not exist; never to everyone. The daemon runs with umask
077, which keeps ``control_privileged`` to its owner.

:class:`PipeWatch` refuses to start when world-writable files are reachable by others or
the privileged socket is open to them, and at every probe compares the directories with
what they must be and each file with what it was: every change is a violation, counted,
reported, and (for the directories and the privileged socket) undone.
"""

from __future__ import annotations

import functools
import grp
import logging
import os
import stat
from dataclasses import dataclass

from agent.core.errors import GpushareError
from agent.mps.limits import DaemonPaths

log = logging.getLogger(__name__)

DAEMON_UMASK = 0o077
PRIVILEGED_SOCKET = "control_privileged"
Observed = tuple[int, int, int]  # (mode, uid, gid)


class PipePermissionError(GpushareError):
    """A pipe directory or file is open to other users: the agent does not start on it."""


@dataclass(frozen=True, slots=True)
class PipeAccess:
    """Owner and group of the pipe and log directories; ``gid`` None: the owner alone."""

    uid: int
    gid: int | None

    @property
    def mode(self) -> int:
        return 0o750 if self.gid is not None else 0o700

    def describe(self) -> str:
        group = "-" if self.gid is None else str(self.gid)
        return f"{self.mode:04o} uid {self.uid} gid {group}"


@functools.lru_cache(maxsize=8)
def _group_gid(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        log.warning(
            "mps.client_group %r does not exist: MPS pipe and log directories are for the "
            "agent's user alone (0700); create the group to let clients in",
            name,
        )
        return None


def resolve_access(client_gid: int, client_group: str) -> PipeAccess:
    """``mps.client_gid`` if set, else ``mps.client_group`` by name, else the owner alone."""
    if client_gid >= 0:
        return PipeAccess(os.geteuid(), client_gid)
    gid = _group_gid(client_group) if client_group else None
    return PipeAccess(os.geteuid(), gid)


def _observe(path: str) -> Observed:
    info = os.lstat(path)
    return stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid


def _show(seen: Observed) -> str:
    return f"{seen[0]:04o} uid {seen[1]} gid {seen[2]}"


class PipeWatch:
    """Checks one daemon's directories and pipe files; counts what changed."""

    def __init__(self, paths: DaemonPaths, access: PipeAccess) -> None:
        self.paths = paths
        self.access = access
        self.violations_total = 0
        self._files: dict[str, Observed] = {}

    def prepare(self) -> None:
        """Create ``<root>/<uuid>/{pipe,log}``: parents 0755 (clients traverse them), the
        pipe and log directories with the access's owner, group and mode."""
        for directory in (self.paths.root, self.paths.base):
            os.makedirs(directory, exist_ok=True)
            os.chmod(directory, 0o755)
        for directory in (self.paths.pipe_dir, self.paths.log_dir):
            os.makedirs(directory, exist_ok=True)
            self._restore_dir(directory)

    def _restore_dir(self, directory: str) -> None:
        gid = -1 if self.access.gid is None else self.access.gid
        os.chown(directory, self.access.uid, gid)
        os.chmod(directory, self.access.mode)

    def check_start(self) -> None:
        """Refuse world-writable pipe files that others can reach, and a privileged socket
        open to group or others; then remember every file as it is."""
        dir_mode = _observe(self.paths.pipe_dir)[0]
        for name, seen in self._scan().items():
            if seen[0] & stat.S_IWOTH and dir_mode & stat.S_IXOTH:
                raise PipePermissionError(
                    f"{self.paths.pipe_dir}/{name} is world-writable ({_show(seen)}) in a "
                    f"directory others can enter ({dir_mode:04o})"
                )
            if name == PRIVILEGED_SOCKET and seen[0] & 0o022:
                raise PipePermissionError(
                    f"{self.paths.pipe_dir}/{name} is writable by group or others "
                    f"({_show(seen)}): it gives full control of the daemon"
                )
        self._files = self._scan()

    def check(self) -> list[str]:
        """What changed since the last check (each a violation, counted); directories and
        the privileged socket are put back."""
        problems = self._check_dirs()
        current = self._scan()
        for name, seen in current.items():
            before = self._files.get(name)
            if before is not None and before != seen:
                problems.append(
                    f"{self.paths.pipe_dir}/{name} changed from {_show(before)} to {_show(seen)}"
                )
            if name == PRIVILEGED_SOCKET and seen[0] & 0o022:
                problems.append(self._close_privileged(seen))
                current[name] = self._observe_file(name) or seen
        self._files = current
        self.violations_total += len(problems)
        return problems

    def _check_dirs(self) -> list[str]:
        problems = []
        for directory in (self.paths.pipe_dir, self.paths.log_dir):
            try:
                seen = _observe(directory)
            except FileNotFoundError:
                continue  # stopping, or removed: the next start prepares it again
            mode, uid, gid = seen
            wrong_group = self.access.gid is not None and gid != self.access.gid
            if mode != self.access.mode or uid != self.access.uid or wrong_group:
                self._restore_dir(directory)
                problems.append(
                    f"{directory} was {_show(seen)}, must be {self.access.describe()}; restored"
                )
        for directory in (self.paths.root, self.paths.base):
            mode = _observe(directory)[0]
            if mode & 0o022:
                os.chmod(directory, 0o755)
                problems.append(f"{directory} was writable by group or others ({mode:04o}); 0755")
        return problems

    def _close_privileged(self, seen: Observed) -> str:
        path = f"{self.paths.pipe_dir}/{PRIVILEGED_SOCKET}"
        os.chmod(path, seen[0] & ~0o077)
        return f"{path} was writable by group or others ({_show(seen)}); closed to its owner"

    def _observe_file(self, name: str) -> Observed | None:
        try:
            return _observe(f"{self.paths.pipe_dir}/{name}")
        except FileNotFoundError:
            return None

    def _scan(self) -> dict[str, Observed]:
        found: dict[str, Observed] = {}
        try:
            names = os.listdir(self.paths.pipe_dir)
        except FileNotFoundError:
            return found
        for name in names:
            seen = self._observe_file(name)
            if seen is not None:
                found[name] = seen
        return found
