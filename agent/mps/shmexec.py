"""Run a control daemon with the shared memory it is given, and say so where others look.

``python -m agent.mps.shmexec --record FILE --shm DIR --root ROOT -- BINARY ARGS...``
makes a mount namespace of its own (``unshare(CLONE_NEWNS)``, every mount private, so
nothing it does reaches the host and nothing mounted later reaches it), binds ``DIR`` on
``/dev/shm`` (``nosuid,nodev,noexec`` on the bind itself), detaches every other mount under
``ROOT`` (the other devices' directories: its servers never hold another device's memory),
writes ``FILE`` and then becomes ``BINARY`` (``exec``: same PID). The daemon's servers are
its children and inherit the namespace: they see ``DIR`` at ``/dev/shm``.

``--shared REASON`` instead of ``--shm``/``--root`` keeps the spawner's ``/dev/shm`` and
records why. ``--probe`` checks that this process may make a mount namespace and mount a
tmpfs in it (root, or ``CAP_SYS_ADMIN``), changes nothing outside it, and exits.

The record (``{"pid", "start", "dir", "reason"}``) is written before ``exec``, so before
the daemon takes the lock on ``control_lock``: whoever finds the daemon by its lock finds
the record of that very process (PID and start time), never one of a predecessor.

Python has no ``os.unshare`` before 3.12 and the image need not carry util-linux's
``mount``: the system calls go through ``ctypes``. This module imports nothing of the
agent, so that it starts fast.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Sequence

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2
CLONE_NEWNS = 0x20000
SHM_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC
DEV_SHM = "/dev/shm"
FAILED = 97  # exit status of a setup that failed before the daemon ran


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.unshare.argtypes = [ctypes.c_int]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _b(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    """mount(2)."""
    what = f"mount {source or fstype or ''} on {target}"
    _check(_libc().mount(_b(source), _b(target), _b(fstype), flags, _b(data or None)), what)


def detach(target: str) -> None:
    """umount2(2) with MNT_DETACH."""
    _check(_libc().umount2(_b(target), MNT_DETACH), f"detach {target}")


def unshare_mounts() -> None:
    """A mount namespace of this process's own, with every mount private in it."""
    _check(_libc().unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def mount_tmpfs(target: str, size_bytes: int, mode: int) -> None:
    mount("tmpfs", target, "tmpfs", SHM_FLAGS, f"size={size_bytes},mode={mode:o}")


def unescape(field: str) -> str:
    """A path as /proc/<pid>/mountinfo writes it: space, tab, newline and backslash in
    octal (``\\040``)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and _octal(field[i + 1 : i + 4]):
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _octal(text: str) -> bool:
    return len(text) == 3 and all(c in "01234567" for c in text)


def mount_points(mountinfo: str) -> list[str]:
    """Every mount point of a mountinfo text, in its order."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(unescape(fields[4]))
    return points


def mounts_under(root: str, mountinfo: str) -> list[str]:
    """The mount points at or below ``root``, deepest first (the order to detach them)."""
    root = root.rstrip("/") or "/"
    found = {p for p in mount_points(mountinfo) if p == root or p.startswith(root + "/")}
    return sorted(found, key=lambda p: (-p.count("/"), p))


def start_time(pid: int | str = "self") -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat):
    with the PID it names one process, whatever reuses the PID later."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def write_record(path: str, *, directory: str, reason: str) -> None:
    """This process's record: what the daemon it becomes sees at /dev/shm."""
    record = {"pid": os.getpid(), "start": start_time(), "dir": directory, "reason": reason}
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def isolate(directory: str, root: str) -> None:
    """In a namespace of its own: ``directory`` at /dev/shm, nothing else of ``root``."""
    unshare_mounts()
    mount(directory, DEV_SHM, None, MS_BIND)
    mount(None, DEV_SHM, None, MS_REMOUNT | MS_BIND | SHM_FLAGS)
    with open("/proc/self/mountinfo") as f:
        under = mounts_under(root, f.read())
    for point in under:
        detach(point)


def probe() -> None:
    """What :func:`isolate` needs, tried in a namespace that dies with this process."""
    unshare_mounts()
    mount_tmpfs(DEV_SHM, 1 << 20, 0o1777)
    mount(None, DEV_SHM, None, MS_REMOUNT | MS_BIND | SHM_FLAGS)


def _parse(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    options: dict[str, str] = {}
    args = list(argv)
    while args and args[0] != "--":
        key = args.pop(0)
        if key == "--probe":
            options["probe"] = "1"
            continue
        if key not in ("--record", "--shm", "--root", "--shared") or not args:
            raise SystemExit(f"shmexec: unknown or incomplete option {key}")
        options[key[2:]] = args.pop(0)
    return options, args[1:]


def main(argv: Sequence[str] | None = None) -> int:
    options, command = _parse(sys.argv[1:] if argv is None else argv)
    try:
        if "probe" in options:
            probe()
            return 0
        if not command or "record" not in options:
            print("shmexec: usage: --record FILE (--shm DIR --root ROOT | --shared WHY) -- CMD")
            return FAILED
        if "shm" in options:
            isolate(options["shm"], options.get("root", options["shm"]))
            write_record(options["record"], directory=options["shm"], reason="")
        else:
            write_record(options["record"], directory="", reason=options.get("shared", ""))
    except OSError as exc:
        print(f"gpushare: cannot give the MPS daemon its shared memory: {exc}", flush=True)
        return FAILED
    sys.stdout.flush()
    os.execvp(command[0], command)  # does not return


if __name__ == "__main__":
    sys.exit(main())
